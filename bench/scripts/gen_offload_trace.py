#!/usr/bin/env python3
"""Write a synthetic trace CSV (action,addr,size,stream,time_us) of one thread serving many streams
with layer offloading: resident weights stay live; per layer, the layer's weights are moved in (4
tensors of 32-90 MiB), then each stream in turn allocates its temporaries (60% 4-64 KiB, 40%
256 KiB - 1 MiB), frees them all, and allocates a few small blocks that stay live to the end (a
KV cache's pieces); then the layer's weights are moved out. The shape of the issue's held-back
ten-stream inference trace, for `vmm-bench replay` (docs/benchmarks.md, "Handle sizes"): with a
thread cache serving every stream, the blocks that stay came from the cache (the temporaries freed
last) and lay scattered over each stream's pages.

usage: gen_offload_trace.py [--streams N] [--layers N] [--tokens N] [--temps N] [--kv N]
                            [--resident-mib N] [--seed N] [-o OUT.csv]
"""

import argparse
import random
import sys

from synthetic_trace import TraceWriter


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=4, help="passes over the layers")
    ap.add_argument("--temps", type=int, default=120, help="temporaries per stream and layer")
    ap.add_argument("--kv", type=int, default=2, help="blocks that stay, per stream and layer")
    ap.add_argument("--resident-mib", type=int, default=6144, help="weights live throughout")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    rnd = random.Random(a.seed)
    out = open(a.output, "w") if a.output else sys.stdout
    trace = TraceWriter(out)
    alloc, free = trace.alloc, trace.free

    resident, left = [], a.resident_mib
    while left > 0:
        mib = min(left, rnd.choice([128, 256, 512]))
        resident.append(alloc(mib << 20, 0))
        left -= mib
    small = [4096, 8192, 16384, 32768, 65536]
    mid = [256 << 10, 512 << 10, 1 << 20]
    kv = []
    for _ in range(a.tokens):
        for _ in range(a.layers):
            weights = [alloc(rnd.choice([32, 64, 90]) << 20, 0) for _ in range(4)]
            for s in range(a.streams):
                tmp = [alloc(rnd.choice(small) if rnd.random() < 0.6 else rnd.choice(mid), s)
                       for _ in range(a.temps)]
                for b in tmp:
                    free(b)
                kv.extend(alloc(rnd.choice(small), s) for _ in range(a.kv))
            for b in weights:
                free(b)
    for b in kv + resident:
        free(b)
    if a.output:
        out.close()


if __name__ == "__main__":
    main(sys.argv[1:])
