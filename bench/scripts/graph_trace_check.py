#!/usr/bin/env python3
"""Record a trace with capture segments on the simulated device (vmm-bench record-graphs) and replay
it in both modes (vmm-bench replay --json): every allocation routed to a private pool lands in it, no
eager allocation lands in graph memory, the private pools' reserve is reported, and the same trace
written back (pool events included) reads the same. Usage: graph_trace_check.py VMM_BENCH OUT.csv"""
import json
import subprocess
import sys


def run(*args):
    p = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=100)
    if p.returncode != 0:
        sys.exit("FAILED: %s exited %d\n%s%s" % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p.stdout


def main():
    bench, out = sys.argv[1], sys.argv[2]
    run(bench, "record-graphs", out, "--steps", "30")
    lines = open(out).read().splitlines()
    actions = [l.split(",")[0] for l in lines[1:]]
    for a in ("pool_begin", "pool_end", "pool_release", "alloc", "free_completed"):
        if a not in actions:
            sys.exit("FAILED: the recorded trace has no %s line" % a)
    if actions.count("pool_begin") != 2 or actions.count("pool_release") != 2:
        sys.exit("FAILED: expected two captures into one pool and two releases")
    results = [json.loads(l) for l in run(bench, "replay", out, "--json", "--no-progress", "--check", "500").splitlines()]
    if [r["mode"] for r in results] != ["expandable", "classic"]:
        sys.exit("FAILED: modes %s" % [r["mode"] for r in results])
    for r in results:
        if r.get("private_pools") != 1:
            sys.exit("FAILED (%s): private_pools %s, expected 1" % (r["mode"], r.get("private_pools")))
        if r["eager_allocations_in_graph_memory"] != 0:
            sys.exit("FAILED (%s): graph memory handed to eager allocations" % r["mode"])
        if r["graph_allocations"] != 2 * (32 + 8) or r["graph_bytes"] <= 0:
            sys.exit("FAILED (%s): %d allocations routed to the pool, expected 80" % (r["mode"], r["graph_allocations"]))
        if r["peak_private_reserved_bytes"] < r["graph_bytes"] // 4:
            sys.exit("FAILED (%s): private reserve %d not reported" % (r["mode"], r["peak_private_reserved_bytes"]))
        if r["ooms"]:
            sys.exit("FAILED (%s): %d OOMs on an 80 GiB device" % (r["mode"], r["ooms"]))
        print("%-10s %3d graph allocations, %7.1f MiB; private pool peak %7.1f MiB; eager in graph memory: 0; "
              "peak reserved %7.1f MiB" % (r["mode"], r["graph_allocations"], r["graph_bytes"] / 2**20,
                                          r["peak_private_reserved_bytes"] / 2**20, r["peak_reserved_bytes"] / 2**20))
    table = run(bench, "replay", out, "--no-progress")
    for needle in ("capture segments: 1 private pool", "allocations routed to private pools",
                   "eager allocations in graph memory (0)"):
        if needle not in table:
            sys.exit("FAILED: the table lacks %r\n%s" % (needle, table))
    print("OK")


if __name__ == "__main__":
    main()
