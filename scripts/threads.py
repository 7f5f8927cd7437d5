#!/usr/bin/env python3
"""Cores busy by thread name over time, for a running Hourglass process.

    scripts/threads.py OUT [EVERY_S]

Waits for a process whose name starts with `hourglass` (the first found), then every EVERY_S
seconds (default 5) reads /proc/PID/task/*/stat and writes one line to OUT: the seconds since
it started, the cores busy in all, and the seven busiest thread names with their cores (user +
system time over the interval; threads of one name, such as the six `tokio-rt-worker`s, are
summed). It stops when the process ends. `bench replay`'s report gives each thread's CPU over
the whole run; this shows when it was spent, e.g. whether cores stood idle between compactions
(BENCHMARKS.md, "Messages of 1,000 points, and what bounds one point a message").
"""
import collections
import os
import sys
import time

USER_HZ = os.sysconf("SC_CLK_TCK")


def find_pid():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().startswith("hourglass"):
                        return p
            except OSError:
                pass
    return None


def seconds_by_name(pid):
    out = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] += (int(fields[11]) + int(fields[12])) / USER_HZ
    return out


def main():
    out = open(sys.argv[1], "w")
    every = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    pid = find_pid()
    while pid is None:
        time.sleep(1)
        pid = find_pid()
    start = then = time.time()
    before = seconds_by_name(pid)
    while True:
        time.sleep(every)
        try:
            now_s = seconds_by_name(pid)
        except OSError:
            break  # the process ended
        now = time.time()
        cores = {k: (v - before.get(k, 0)) / (now - then) for k, v in now_s.items()}
        top = sorted(cores.items(), key=lambda kv: -kv[1])[:7]
        out.write(f"{now - start:7.0f} total {sum(cores.values()):4.2f} " + " ".join(f"{k}={v:.2f}" for k, v in top) + "\n")
        out.flush()
        before, then = now_s, now


if __name__ == "__main__":
    main()
