#!/usr/bin/env python3
"""Write a synthetic trace CSV (action,addr,size,stream,time_us) of one thread driving many streams
in turn: 40 weight tensors of 8-32 MiB stay live; then, per layer, each stream allocates 100-400
tensors (90% small: 512 B - 64 KiB, 10% large: 1-5 MiB steps or 1-12 MiB uniform), frees a random
live one now and then, and frees the rest at the layer's end. A shape like inference with layer
offloading on several streams, for `vmm-bench replay` (docs/benchmarks.md, "Handle sizes").

usage: gen_streams_trace.py [--streams N] [--layers N] [--seed N] [--large-step-mib N] [-o OUT.csv]
"""

import argparse
import random
import sys

from synthetic_trace import TraceWriter


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--layers", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--large-step-mib", type=int, default=1, help="unit of the stepped large sizes")
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    rnd = random.Random(a.seed)
    out = open(a.output, "w") if a.output else sys.stdout
    trace = TraceWriter(out)
    alloc, free = trace.alloc, trace.free

    weights = [alloc(rnd.choice([8, 16, 32]) << 20, 0) for _ in range(40)]
    small = [512, 1024, 4096, 8192, 16384, 32768, 65536]
    for _ in range(a.layers):
        for s in range(a.streams):
            live = []
            for _ in range(rnd.randint(100, 400)):
                if rnd.random() < 0.9:
                    size = rnd.choice(small)
                elif rnd.random() < 0.7:
                    size = rnd.choice([1, 2, 3, 5]) * a.large_step_mib << 20
                else:
                    size = rnd.randint(1 << 20, 12 << 20)
                live.append(alloc(size, s))
                if len(live) > 30 and rnd.random() < 0.6:
                    free(live.pop(rnd.randrange(len(live))))
            for b in live:
                free(b)
    for b in weights:
        free(b)
    if a.output:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
