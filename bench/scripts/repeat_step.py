#!/usr/bin/env python3
"""Lengthen a recorded PyTorch trace CSV (action,addr,size,stream[,time_us]) by repeating one of its
training steps: the events before the step as recorded, then the step N times, for `vmm-bench
replay` of a long run when only a few steps were recorded (docs/benchmarks.md, "Handle sizes").

A step is the alloc / free_completed events [FROM, TO) (indices among those two actions; by default
the trace's last complete step: between the two last times live bytes fall to their least value
after the trace's peak). Each repetition allocates at fresh addresses. A free inside the step of a
block the step did not allocate (a gradient of the previous step freed by zero_grad, say) frees,
from the second repetition on, the oldest block of the same size that the previous repetition left
live; the events after the step are dropped. free_requested lines are dropped (the replay acts on
free_completed).

usage: repeat_step.py TRACE.csv [--from N --to M] [--times N] [-o OUT.csv]
"""

import argparse
import collections
import csv
import sys


def read_events(path):
    with open(path, newline="") as f:
        return [(r["action"], r["addr"], int(r["size"]), r["stream"]) for r in csv.DictReader(f)
                if r["action"] in ("alloc", "free_completed")]


def live_curve(ev):
    live, cur, curve = {}, 0, []
    for action, addr, size, _ in ev:
        if action == "alloc":
            live[addr] = size
            cur += size
        elif addr in live:
            cur -= live.pop(addr)
        curve.append(cur)
    return curve


def last_step(ev):
    """[from, to) between the two last points after which live bytes fall back to a level seen
    before (a step boundary: what stays across steps is live, nothing of the step is)."""
    curve = live_curve(ev)
    # the steps' low point: the least live bytes after the trace's peak
    peak_at = max(range(len(curve)), key=curve.__getitem__)
    low = min(curve[peak_at:])
    marks = [i + 1 for i in range(len(curve)) if curve[i] == low]
    # boundaries: the first index of each run of low points
    starts = [m for k, m in enumerate(marks) if k == 0 or marks[k - 1] != m - 1]
    if len(starts) < 2:
        return None
    return starts[-2], starts[-1]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--from", dest="lo", type=int)
    ap.add_argument("--to", dest="hi", type=int)
    ap.add_argument("--times", type=int, default=30)
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    ev = read_events(a.trace)
    if (a.lo is None) != (a.hi is None):
        ap.error("give both --from and --to, or neither")
    if a.lo is None:
        step = last_step(ev)
        if not step:
            sys.exit(f"repeat_step: no two step boundaries found in {a.trace}; give --from and --to")
        a.lo, a.hi = step
    if not 0 <= a.lo < a.hi <= len(ev) or a.times < 1:
        ap.error(f"need 0 <= --from < --to <= {len(ev)} and --times >= 1")
    out = open(a.output, "w") if a.output else sys.stdout
    out.write("action,addr,size,stream,time_us\n")
    t = 0

    def emit(action, addr, size, stream):
        nonlocal t
        t += 1
        out.write(f"{action},{addr},{size},{stream},{t}\n")

    for e in ev[:a.lo]:
        emit(*e)
    step = ev[a.lo:a.hi]
    fresh = 1 << 50
    left = None  # per size: the previous repetition's blocks still live, oldest first
    unmatched = 0
    for rep in range(a.times):
        mine, live = {}, {}
        for action, addr, size, stream in step:
            if action == "alloc":
                mine[addr] = fresh
                live[fresh] = size
                emit(action, fresh, size, stream)
                fresh += (size + 4095) // 4096 * 4096 + 4096
            elif addr in mine:
                new = mine.pop(addr)
                live.pop(new)
                emit(action, new, size, stream)
            elif left is None:
                emit(action, addr, size, stream)  # a block from before the step, as recorded
            elif left[size]:
                emit(action, left[size].popleft(), size, stream)
            else:
                unmatched += 1
        left = collections.defaultdict(collections.deque)
        for addr, size in live.items():
            left[size].append(addr)
    if a.output:
        out.close()
    print(f"repeat_step: events [{a.lo}, {a.hi}) x {a.times}; {unmatched} frees without a match",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
