#!/usr/bin/env python3
"""Compactions, flushes and write stalls by column family, from RocksDB's info LOG.

    scripts/compactions.py DATA_DIR/rocksdb/LOG.old.* DATA_DIR/rocksdb/LOG

Give the files oldest first (a store reopened moves its LOG to LOG.old.<time>). For each column
family: the compactions (count, CPU and wall seconds, bytes written, input records, how many
level-0 files each took or "not from level 0", which level each wrote), the memtable flushes
(count, entries), and the lines where RocksDB slowed or stopped the writes. The figures come
from the `compaction_finished` and `flush_started` events as RocksDB 11.8 writes them; a job's
column family and level-0 inputs come from its "[cf] [JOB n] Compacting N@L ..." or
"[cf] [JOB n] Flushing memtable" line.
BENCHMARKS.md quotes this script's output where it gives compactions by column family.
"""
import collections
import json
import re
import signal
import sys

COMPACTING = re.compile(r"\[([^\]]+)\] \[JOB (\d+)\] Compacting (\d+)@(\d+)")
FLUSHING = re.compile(r"\[([^\]]+)\] \[JOB (\d+)\] Flushing memtable")
STALL = re.compile(r"\[([^\]]+)\] (Stalling|Stopping) writes because (.*?)(?: rate \d+)?$")
EVENT = "EVENT_LOG_v1"


def new_cf():
    return {
        "compactions": 0,
        "cpu_s": 0.0,
        "wall_s": 0.0,
        "bytes_written": 0,
        "input_records": 0,
        "level0_files": collections.Counter(),
        "output_levels": collections.Counter(),
        "flushes": 0,
        "flushed_entries": 0,
        "stalls": collections.Counter(),
    }


def read(paths):
    cfs = collections.defaultdict(new_cf)
    for path in paths:
        # JOB numbers restart when a store is reopened.
        job_cf, job_level0 = {}, {}
        with open(path, errors="replace") as log:
            for line in log:
                if m := COMPACTING.search(line):
                    job = int(m.group(2))
                    job_cf[job] = m.group(1)
                    job_level0[job] = int(m.group(3)) if m.group(4) == "0" else 0
                    continue
                if m := FLUSHING.search(line):
                    job_cf[int(m.group(2))] = m.group(1)
                    continue
                if m := STALL.search(line):
                    reason = re.sub(r"(?<= )\d+", "N", m.group(3).strip())
                    cfs[m.group(1)]["stalls"][f"{m.group(2)} writes: {reason}"] += 1
                    continue
                at = line.find(EVENT)
                if at < 0:
                    continue
                try:
                    event = json.loads(line[at + len(EVENT):])
                except ValueError:
                    continue
                kind, job = event.get("event"), event.get("job")
                if kind == "compaction_finished":
                    cf = cfs[job_cf.get(job, "?")]
                    cf["compactions"] += 1
                    cf["cpu_s"] += event.get("compaction_time_cpu_micros", 0) / 1e6
                    cf["wall_s"] += event.get("compaction_time_micros", 0) / 1e6
                    cf["bytes_written"] += event.get("total_output_size", 0)
                    cf["input_records"] += event.get("num_input_records", 0)
                    cf["level0_files"][job_level0.get(job, 0)] += 1
                    cf["output_levels"][event.get("output_level")] += 1
                elif kind == "flush_started":
                    cf = cfs[job_cf.get(job, "?")]
                    cf["flushes"] += 1
                    cf["flushed_entries"] += event.get("total_num_input_entries", 0)
    return cfs


def main():
    paths = sys.argv[1:]
    if paths and paths[0] in ("-h", "--help"):
        print(__doc__.strip())
        return
    if not paths:
        sys.exit(__doc__.strip())
    try:
        cfs = read(paths)
    except OSError as e:
        sys.exit(f"compactions.py: cannot read {e.filename}: {e.strerror}")
    for name, cf in sorted(cfs.items()):
        level0 = ", ".join(
            f"{files} files: {n}" if files else f"not from level 0: {n}"
            for files, n in sorted(cf["level0_files"].items())
        )
        levels = ", ".join(f"L{level}: {n}" for level, n in sorted(cf["output_levels"].items()))
        print(
            f"{name}: {cf['compactions']} compactions, {cf['cpu_s']:.1f} s CPU, "
            f"{cf['wall_s']:.1f} s wall, {cf['bytes_written'] / 1e9:.2f} GB written, "
            f"{cf['input_records']:,} input records"
        )
        if cf["compactions"]:
            print(f"  level-0 inputs ({level0}); output ({levels})")
        print(f"  flushes: {cf['flushes']}, {cf['flushed_entries']:,} entries")
        for stall, n in cf["stalls"].most_common():
            print(f"  {stall}: {n} lines")


if __name__ == "__main__":
    # Piped into `head`, stop quietly when the reader has had enough.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
