#!/usr/bin/env python3
"""Samples per thread of a `perf script -F comm,ip,sym` file (profile-http.sh's script.txt),
and with a thread name, that thread's leaf functions by samples.

  python3 scripts/peers/perf_threads.py OUT/LABEL/script.txt [THREAD [TOP]]

(`perf report --comms` filters the listing but keeps shares of all samples; this counts from
the samples themselves.)
"""
import collections
import sys


def stacks(path):
    comm, cur = None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if cur:
                yield comm, cur
            cur = []
        elif not line.startswith((" ", "\t")):
            comm = line.split()[0]
        else:
            parts = line.strip().split(None, 1)
            cur.append(parts[1] if len(parts) > 1 else "?")
    if cur:
        yield comm, cur


def main():
    all_ = list(stacks(sys.argv[1]))
    total = len(all_)
    by_thread = collections.Counter(c for c, _ in all_)
    print(f"samples {total}: " + ", ".join(f"{c} {n} ({100 * n / total:.1f}%)" for c, n in by_thread.most_common()))
    if len(sys.argv) > 2:
        top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
        leaves = collections.Counter(st[0][:90] for c, st in all_ if c == sys.argv[2])
        for sym, n in leaves.most_common(top):
            print(f"{n:7d} {100 * n / total:6.2f}%  {sym}")


if __name__ == "__main__":
    main()
