#!/usr/bin/env python3
"""Markdown comparison table from a compare.sh output directory (medians over the runs).

  table.py /tmp/hg-peers/iot-1000x1h
"""
import glob
import json
import os
import statistics
import sys

QUERIES = {
    "a": "last reading, 1 truck",
    "b": "raw readings, 1 truck × 1 h",
    "c": "hourly mean velocity, 1 truck × 1 day",
    "d": "max fuel_consumption, 100 trucks × 1 h",
    "e": "mean load per fleet, whole range",
}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=0):
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    out = sys.argv[1]
    meta = load(os.path.join(out, "w.lp.meta.json"))
    rows, qrows = [], {}
    systems = ["hourglass", "http-hourglass", "influxdb", "victoria-metrics"]
    for s in systems:
        loads = sorted(glob.glob(os.path.join(out, f"load-{s}-*.json")))
        queries = sorted(glob.glob(os.path.join(out, f"query-{s}-*.json")))
        if not loads:
            continue
        L = [load(p) for p in loads]
        if s == "hourglass":
            pts = [x["stored"] / x["wall_seconds"] for x in L]
            vals = [x["values_per_second"] for x in L]
            wall = [x["wall_seconds"] for x in L]
            disks = []
            for i, p in enumerate(loads):
                d = p.replace("load-hourglass-", "disk-hourglass-").replace(".json", ".txt")
                if os.path.exists(d):
                    disks.append(int(open(d).read().strip()) / max(1, L[i]["stored_values"] or 1))
            bpv = med(disks)
            bpv_sst = med([x.get("bytes_per_value") for x in L])
            rss = med([x["peak_rss_bytes"] for x in L])
            # --close-hours adds one reading (one value) of the `clock` table.
            clock = [1 if x["setup"].get("rollup_close_seconds") is not None else 0 for x in L]
            stored_ok = all(x["stored"] == meta["lines"] and x["stored_values"] - c == meta["field_values"]
                            for x, c in zip(L, clock))
            path = "MQTT (embedded broker) QoS 1, JSON, 4 conn × 100 points/msg"
        elif s == "http-hourglass":
            # The peers' loader into Hourglass's InfluxDB write API; the data dir after
            # `hourglass compact` (else as the shutdown left it), and `buckets` SST files.
            pts = [x["points_per_s"] for x in L]
            vals = [x["values_per_s"] for x in L]
            wall = [x["wall_s"] for x in L]
            disks, ssts = [], []
            for p in loads:
                c = p.replace("load-http-hourglass-", "compact-http-hourglass-")
                d = p.replace("load-http-hourglass-", "disk-http-hourglass-").replace(".json", ".txt")
                if os.path.exists(c) and os.path.getsize(c) > 0:
                    compacted = load(c)
                    disks.append(compacted["bytes_after"] / meta["field_values"])
                    ssts.append(compacted["buckets_sst_bytes"] / meta["field_values"])
                elif os.path.exists(d):
                    disks.append(int(open(d).read().strip()) / meta["field_values"])
            bpv = med(disks)
            bpv_sst = med(ssts) if ssts else None
            rss = med([x["run"].get("server_rss_max_bytes") for x in L])
            stats = [load(p.replace("load-http-hourglass-", "stats-http-hourglass-")) for p in loads]
            stored_ok = all(x["lines_ok"] == meta["lines"] and st["store"]["readings"] == meta["lines"]
                            for x, st in zip(L, stats))
            path = "HTTP line protocol (InfluxDB write API), 4 workers × 5000 lines"
        else:
            pts = [x["points_per_s"] for x in L]
            vals = [x["values_per_s"] for x in L]
            wall = [x["wall_s"] for x in L]
            bpv = med([x.get("bytes_per_value_settled") for x in L])
            bpv_sst = None
            rss = med([x["run"].get("server_rss_max_bytes") for x in L])
            stored_ok = all(isinstance(x.get("stored_counts"), dict) and x["stored_counts"] == x.get("expected_counts")
                            for x in L)
            path = "HTTP line protocol, 4 workers × 5000 lines"
        rows.append((s, len(L), med(pts), med(vals), med(wall), bpv, bpv_sst, rss, stored_ok, path,
                     [round(p) for p in pts]))
        Q = [load(p) for p in queries]
        for k in QUERIES:
            recs = [q["queries"][k] for q in Q if k in q.get("queries", {})]
            if recs:
                qrows.setdefault(k, {})[s] = (med([r["p50_ms"] for r in recs]), med([r["p99_ms"] for r in recs]))
    print(f"Workload: {meta['devices']:,} trucks × {meta['ticks']} ticks of {meta['interval_ms'] // 1000} s: "
          f"{meta['lines']:,} points ({meta['lines_readings']:,} readings, {meta['lines_diagnostics']:,} diagnostics), "
          f"{meta['field_values']:,} field values, {meta['points_missing']:,} missing, {meta['points_late']:,} late.\n")
    print("| system | runs | points/s (median) | values/s | wall s | bytes/value (data dir) | bytes/value (SST) "
          "| peak RSS MiB | all stored | ingest path | points/s per run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s, n, p, v, w, b, bs, rss, ok, path, per in rows:
        print(f"| {s} | {n} | {fmt(p)} | {fmt(v)} | {fmt(w, 1)} | {fmt(b, 2)} | {fmt(bs, 3)} | "
              f"{fmt(rss / 2**20 if rss else None)} | {'yes' if ok else 'NO'} | {path} | {' · '.join(map(str, per))} |")
    # Systems that ran the query set (the HTTP-loaded Hourglass runs measure ingest only).
    queried = [s for s, *_ in rows if any(s in q for q in qrows.values())]
    print("\n| query | " + " | ".join(f"{s} p50 / p99 ms" for s in queried) + " |")
    print("|---|" + "---|" * len(queried))
    for k, label in QUERIES.items():
        cells = []
        for s in queried:
            x = qrows.get(k, {}).get(s)
            cells.append(f"{fmt(x[0], 2)} / {fmt(x[1], 2)}" if x else "n/a")
        print(f"| {k}: {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
