#!/usr/bin/env python3
"""The peers' query set (../shared/peers/query.py, a-e) against Hourglass's HTTP API.

  hg_query.py --url http://127.0.0.1:8080 --meta FILE.lp.meta.json --json out.json

Same method as query.py: one keep-alive connection, sequential, 1 warm-up then up to --reps
runs (at least --min-reps, --max-seconds budget), latency = request sent -> whole body read,
p50/p99 linear-interpolated; trucks and hours drawn from the same seeded streams as query.py,
so each system answers the same sequence. Hourglass's mapping (it has no query language):

  a  last reading of one truck          GET /v1/tables/iot.readings/latest?devices=truck_X
  b  one truck's raw readings, 1 h      GET .../devices/truck_X/readings?from=h0&to=h0+1h
  c  hourly mean velocity, 1 day        GET .../rollups?device=truck_X&level=hour&from=S&to=S+24h
                                            &fields=velocity&aggs=mean
  d  max fuel_consumption, 100 trucks   GET .../rollups?devices=truck_X,truck_Y,...&level=hour&from=h0&to=h0+1h
                                            &fields=fuel_consumption&aggs=max (one request, a series per truck)
  e  mean load per fleet                4 x GET /v1/tables/iot.diagnostics/rollups?group=fleet/F&level=hour&from=S&to=E
                                            &fields=load&aggs=mean&group_level=year (one query = 4 requests; the
                                            trucks are placed under fleet/F by `bench replay --place-by-fleet`)
"""
import argparse
import http.client
import json
import random
import time
import urllib.parse

HOUR = 3600000
# The workload's fleets (bench/src/workload.rs, FLEETS).
FLEETS = ["East", "West", "North", "South"]
DAY = 24 * HOUR


def percentile(vals, p):
    v = sorted(vals)
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--prefix", default="iot")
    ap.add_argument("--queries", default="abcde")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--min-reps", type=int, default=20)
    ap.add_argument("--max-seconds", type=float, default=45)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json")
    a = ap.parse_args()
    meta = json.load(open(a.meta))
    D, S, E = meta["devices"], meta["start_ms"], meta["end_ms"]
    nh = max(1, (E - S) // HOUR)
    u = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    table = a.prefix + ".readings"
    rng = random.Random()

    def get(path):
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError("HTTP %d on %s: %s" % (r.status, path, body[:300]))
        return body

    def make(k):
        # Same draws, in the same order, as query.py's make().
        trucks = ["truck_%d" % i for i in rng.sample(range(D), min(100, D) if k == "d" else 1)]
        h0 = S + rng.randrange(nh) * HOUR if E - S > HOUR else S
        t = trucks[0]
        if k == "a":
            return ["/v1/tables/%s/latest?devices=%s" % (table, t)]
        if k == "b":
            return ["/v1/tables/%s/devices/%s/readings?from=%d&to=%d" % (table, t, h0, h0 + HOUR)]
        if k == "e":
            return ["/v1/tables/%s.diagnostics/rollups?group=fleet/%s&level=hour&from=%d&to=%d&fields=load&aggs=mean"
                    "&group_level=year" % (a.prefix, f, S, E) for f in FLEETS]
        if k == "c":
            return ["/v1/tables/%s/rollups?device=%s&level=hour&from=%d&to=%d&fields=velocity&aggs=mean"
                    % (table, t, S, S + DAY)]
        return ["/v1/tables/%s/rollups?devices=%s&level=hour&from=%d&to=%d&fields=fuel_consumption&aggs=max"
                % (table, ",".join(trucks), h0, h0 + HOUR)]

    def run(paths):
        t0 = time.perf_counter()
        bodies = [get(p) for p in paths]
        return time.perf_counter() - t0, bodies

    def digest(k, bodies):
        js = [json.loads(b) for b in bodies]
        if k == "a":
            return {"rows": sum(1 for x in js[0]["latest"] if x["reading"])}
        if k == "b":
            return {"rows": len(js[0]["readings"])}
        if k == "e":
            return {"fleets": {f: [r.get("load", {}).get("mean") for r in j["rows"]] for f, j in zip(FLEETS, js)}}
        if k == "d":
            series = js[0]["series"]
            return {"series": len(series), "rows": sum(len(x["rows"]) for x in series), "sample": series[0]["rows"][:2]}
        return {"series": len(js), "rows": sum(len(j["rows"]) for j in js), "sample": js[0]["rows"][:2]}

    out = {"kind": "query", "target": "hourglass", "devices": D, "start_ms": S, "end_ms": E, "queries": {}}
    for k in a.queries:
        rng.seed("%d-%s" % (a.seed, k))
        first, bodies = run(make(k))
        lats = []
        t_start = time.time()
        while len(lats) < a.reps and (len(lats) < a.min_reps or time.time() - t_start < a.max_seconds):
            lt, _ = run(make(k))
            lats.append(lt)
        rec = {"n": len(lats), "first_ms": round(first * 1e3, 2),
               "p50_ms": round(percentile(lats, 50) * 1e3, 2), "p99_ms": round(percentile(lats, 99) * 1e3, 2),
               "max_ms": round(max(lats) * 1e3, 2), "check_first_response": digest(k, bodies)}
        out["queries"][k] = rec
        print("%s hourglass: n=%d p50 %.2f ms p99 %.2f ms | %s" % (k, rec["n"], rec["p50_ms"], rec["p99_ms"],
                                                                   json.dumps(rec["check_first_response"])[:160]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
