#!/usr/bin/env python3
"""Convert a PyTorch profiler (Kineto) Chrome trace recorded with profile_memory=True into the
trace CSV that vmm-bench replays: action,addr,size,stream,time_us.

The profiler writes one instant event named "[memory]" per allocator call, with args "Device Type"
(1 = CUDA; 6 = HIP, PyTorch on ROCm, the same caching allocator), "Device Id", "Addr" and "Bytes"
(positive: an allocation of that many bytes at Addr; negative: its free). Each becomes an 'alloc' or
a 'free_completed' line, ordered by time stamp (and by "Ev Idx" where present; the autograd thread's
events interleave with the main thread's; without "Ev Idx", a free written before its block's
allocation in the same time stamp goes after it). The profiler does not record the stream, so every line is
on stream 0. Only events inside the profiler's active window are there: a free of a block allocated
before it is kept in the CSV and dropped by vmm-bench (counted as a free of an unknown address), and
the blocks live when the window opened are not in the replay. Traces from profilers that predate the
"Addr" field (before PyTorch 1.10) cannot pair frees with allocations and are refused.

Standard library only; reads .json or .json.gz.

usage: kineto_to_trace.py TRACE.json[.gz] [-o OUT.csv] [--device N]
exit: 0 written; 2 not a usable trace (message on stderr).
"""

import argparse
import gzip
import json
import math
import sys

# c10::DeviceType values of GPU memory; older profilers wrote the name.
GPU_TYPES = (1, 6, "CUDA", "cuda", "HIP", "hip")


def load(path):
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def memory_events(trace):
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace: no 'traceEvents' list")
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("name") != "[memory]":
            continue
        a = e.get("args")
        if not isinstance(a, dict):
            continue
        if a.get("Device Type") not in GPU_TYPES:
            continue
        out.append((i, e, a))
    return out


def int_field(a, key, default, i):
    """An integer argument of trace event i ("Device Id", "Ev Idx"), or a clear error."""
    v = a.get(key, default)
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"trace event {i}: bad '{key}' {v!r} (an integer)") from None


def convert(trace, device=None):
    """Returns (rows, device, dropped): rows are (action, addr, size, time_us)."""
    mem = memory_events(trace)
    if not mem:
        raise ValueError("no GPU '[memory]' events: record with torch.profiler.profile(profile_memory=True)")
    devices = sorted({int_field(a, "Device Id", 0, i) for i, _, a in mem})
    if device is None:
        if len(devices) != 1:
            raise ValueError(f"GPU memory events of devices {devices}: choose one with --device")
        device = devices[0]
    elif device not in devices:
        raise ValueError(f"no GPU memory events of device {device} (devices: {devices})")
    picked = []
    for i, e, a in mem:
        if int_field(a, "Device Id", 0, i) != device:
            continue
        if "Addr" not in a:
            raise ValueError("memory events carry no 'Addr': frees cannot be paired with allocations "
                             "(a profiler older than PyTorch 1.10?)")
        try:
            ts, addr, nbytes = float(e["ts"]), int(a["Addr"]), int(a["Bytes"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"trace event {i}: bad or missing field: {err}") from None
        # json reads NaN and Infinity: no order and no time_us; the CSV's addresses are unsigned.
        if not math.isfinite(ts):
            raise ValueError(f"trace event {i}: bad 'ts' {e['ts']!r} (a time stamp in microseconds)")
        if addr < 0:
            raise ValueError(f"trace event {i}: bad 'Addr' {addr} (negative)")
        picked.append((ts, int_field(a, "Ev Idx", i, i), i, addr, nbytes, "Ev Idx" in a))
    picked.sort()
    rows, dropped = [], 0
    for ts, _, _, addr, nbytes, idx in picked:
        if nbytes > 0:
            rows.append(("alloc", addr, nbytes, ts, idx))
        elif nbytes < 0:
            rows.append(("free_completed", addr, -nbytes, ts, idx))
        else:
            dropped += 1
    return [r[:4] for r in after_alloc(rows)], device, dropped


def after_alloc(rows):
    """A free without "Ev Idx" of a block not live, followed in the same time stamp by that
    address's allocation (also without), moves to just after it: file order broke the tie, and
    another thread's events may be written first. A free of a block live before stays where it is,
    and so does every event that "Ev Idx" ordered."""
    live = set()
    k = 0
    while k < len(rows):
        action, addr, _, ts, idx = rows[k]
        if action == "free_completed" and addr not in live and not idx:
            j = k + 1
            while j < len(rows) and rows[j][3] == ts and not (
                    rows[j][0] == "alloc" and rows[j][1] == addr and not rows[j][4]):
                j += 1
            if j < len(rows) and rows[j][3] == ts:
                rows.insert(j, rows.pop(k))  # now right after the allocation; look at row k again
                continue
        if action == "alloc":
            live.add(addr)
        else:
            live.discard(addr)
        k += 1
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", help="output CSV (default: stdout)")
    ap.add_argument("--device", type=int, help="GPU device id (default: the only one in the trace)")
    args = ap.parse_args()
    try:
        rows, device, dropped = convert(load(args.trace), args.device)
    except (OSError, ValueError, EOFError) as err:  # json.JSONDecodeError is a ValueError
        print(f"kineto_to_trace: {args.trace}: {err}", file=sys.stderr)
        return 2
    out = open(args.output, "w") if args.output else sys.stdout
    try:
        out.write("action,addr,size,stream,time_us\n")
        for action, addr, size, ts in rows:
            out.write(f"{action},{addr},{size},0,{int(ts)}\n")
    finally:
        if args.output:
            out.close()
    print(f"kineto_to_trace: wrote {len(rows)} events of GPU device {device}"
          f"{f' ({dropped} of 0 bytes skipped)' if dropped else ''}"
          f"{f' to {args.output}' if args.output else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
