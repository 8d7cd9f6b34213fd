#!/usr/bin/env python3
"""Cost of call stacks in the allocation history, seen from Python (the Python-frame half of
`vmm-bench frames`). Standard library and the vmmalloc package only; no PyTorch, no GPU:

    VMMALLOC_LIB=build/libvmmalloc.so python3 bench/scripts/frames_python.py [--pairs N] [--depth D] [--json]

It times malloc + free pairs of 4 KiB through vmm_torch_malloc / vmm_torch_free on the simulated
driver, called with ctypes from a Python function D frames deep (default 20, a typical PyTorch
model's depth), for history off, history without stacks, and stacks "python", "native" and "all".
Two callers: one that keeps the GIL during the call (ctypes.PyDLL, as a tensor freed from Python)
and one that releases it (ctypes.CDLL, as PyTorch's op bindings do; its Python frames are gathered
before the allocator's lock, taking the GIL back for that). ctypes itself costs about a
microsecond per call; the differences between rows are the recording.
"""
import argparse
import ctypes
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("VMMALLOC_CONF", "driver:sim,sim_capacity:1G,sim_backed:false")
import vmmalloc  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = vmmalloc.library_path()
    vmmalloc.load()
    libs = {"gil-held": ctypes.PyDLL(path), "gil-released": ctypes.CDLL(path)}
    for L in libs.values():
        L.vmm_torch_malloc.restype = ctypes.c_void_p
        L.vmm_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        L.vmm_torch_free.restype = None
        L.vmm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

    def pairs(L, n):
        m, f = L.vmm_torch_malloc, L.vmm_torch_free
        t = time.perf_counter()
        for _ in range(n):
            f(m(4096, 0, None), 4096, 0, None)
        return (time.perf_counter() - t) / n * 1e9

    def at_depth(d, L, n):
        return at_depth(d - 1, L, n) if d else pairs(L, n)

    modes = (("history off", None), ("history, no stacks", None), ("stacks=python", "python"),
             ("stacks=native", "native"), ("stacks=all", "all"))
    rows = []
    for label, stacks in modes:
        if label == "history off":
            vmmalloc.record_memory_history(0, 0)
        else:
            vmmalloc.record_memory_history(100000, 0, stacks=stacks)
        row = {"mode": label}
        for caller, L in libs.items():
            pairs(L, 1000)
            row[caller] = min(at_depth(args.depth, L, args.pairs) for _ in range(5))
        rows.append(row)
    vmmalloc.record_memory_history(0, 0)
    if args.json:
        for r in rows:
            print(json.dumps({k: (round(v) if isinstance(v, float) else v) for k, v in r.items()}))
        return 0
    print("malloc + free pair of 4 KiB from Python %d frames deep (sim driver, best of 5 x %d pairs)"
          % (args.depth, args.pairs))
    print("%-22s %14s %14s %16s" % ("mode", "GIL held ns", "GIL released", "held vs no stacks"))
    base = rows[1]["gil-held"]
    for r in rows:
        print("%-22s %14.0f %14.0f %+16.0f" % (r["mode"], r["gil-held"], r["gil-released"], r["gil-held"] - base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
