#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot pickle (torch.cuda.memory._dump_snapshot) into the flattened
trace CSV that vmm-bench replays: action,addr,size,stream,time_us, one line per device trace entry.

Standard library only. The pickle comes from elsewhere, so it is read with an unpickler that refuses
every class: a snapshot holds only dicts, lists, strings and numbers, and anything else is an error
(exit 2), never code that runs.

usage: snapshot_to_trace.py SNAPSHOT.pickle [-o OUT.csv] [--device N]
"""

import argparse
import io
import pickle
import sys

# Trace entries that carry an address and a size. 'snapshot' and 'oom' entries do not.
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap")


class RefusingUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load class {module}.{name}: a snapshot holds no classes")


def load_snapshot(path):
    with open(path, "rb") as f:
        return RefusingUnpickler(io.BufferedReader(f)).load()


def device_trace(snapshot, device):
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a memory snapshot: no 'device_traces' key")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or device >= len(traces):
        raise ValueError(f"snapshot has {len(traces) if isinstance(traces, list) else 0} device trace(s); "
                         f"device {device} requested")
    return traces[device]


def write_csv(entries, out):
    out.write("action,addr,size,stream,time_us\n")
    n = 0
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"trace entry {i} is not a dict")
        action = e.get("action")
        if action not in ACTIONS:
            continue
        try:
            addr, size, stream = int(e["addr"]), int(e["size"]), int(e.get("stream", 0))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"trace entry {i} ({action}): bad or missing field: {err}") from None
        t = e.get("time_us", "")
        out.write(f"{action},{addr},{size},{stream},{'' if t is None else t}\n")
        n += 1
    return n


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("snapshot")
    ap.add_argument("-o", "--output", help="output CSV (default: stdout)")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        snap = load_snapshot(args.snapshot)
        entries = device_trace(snap, args.device)
        if args.output:
            with open(args.output, "w", newline="\n") as out:
                n = write_csv(entries, out)
        else:
            n = write_csv(entries, sys.stdout)
    except (pickle.UnpicklingError, ValueError, EOFError) as err:
        print(f"snapshot_to_trace: {args.snapshot}: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"snapshot_to_trace: {err}", file=sys.stderr)
        return 1
    if args.output:
        print(f"snapshot_to_trace: wrote {n} trace entries to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
