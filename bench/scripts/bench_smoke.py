#!/usr/bin/env python3
"""Smoke tests of vmm-bench (ctest label 'bench'): each runs the program on real or hand-made input
and checks its output. Standard library only.

usage: bench_smoke.py TEST VMM_BENCH WORKLOADS_DIR BENCH_SOURCE_DIR
"""

import collections
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile

TRACE = "cs336_bcrafton_gpt2small_compiled_trainstep.trace.csv"
PICKLE = "cs336_bcrafton_memory_snapshot.pickle"

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"CHECK failed: {what}", file=sys.stderr)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=100, **kw)


def workload(wdir, name):
    path = os.path.join(wdir, name)
    if not os.path.isfile(path):
        print(f"bench_smoke: MISSING WORKLOAD {path}: the bench tests read workloads/pytorch "
              f"in the repository", file=sys.stderr)
        sys.exit(1)
    return path


def replay_json(bench, path, *extra):
    p = run([bench, "replay", path, "--json", "--no-progress", *extra])
    if p.returncode != 0:
        print(p.stdout, p.stderr, file=sys.stderr)
        sys.exit(f"vmm-bench replay {path} exited {p.returncode}")
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    return {r["mode"]: r for r in rows}


def lower_bound_csv(path):
    """Peak of live bytes, computed independently of vmm-bench from a PyTorch trace CSV."""
    live, cur, peak = {}, 0, 0
    with open(path) as f:
        next(f)
        for line in f:
            action, addr, size = line.split(",")[:3]
            if action == "alloc":
                if addr in live:
                    cur -= live.pop(addr)
                live[addr] = int(size)
                cur += int(size)
                peak = max(peak, cur)
            elif action == "free_completed" and addr in live:
                cur -= live.pop(addr)
    return peak


def t_replay_json(bench, wdir, src):
    path = workload(wdir, TRACE)
    modes = replay_json(bench, path, "--min-capacity", "--check", "64")
    check(set(modes) == {"expandable", "classic"}, f"both modes present, got {sorted(modes)}")
    e, c = modes["expandable"], modes["classic"]
    lb = lower_bound_csv(path)
    check(e["lower_bound_bytes"] == lb, f"lower bound {e['lower_bound_bytes']} == recomputed {lb}")
    for m in (e, c):
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "ooms", "min_capacity_bytes"):
            check(key in m, f"{m['mode']}: key {key} present")
        check(m["ooms"] == 0, f"{m['mode']}: no OOM at 80 GiB (got {m['ooms']})")
        check(m["peak_allocated_bytes"] >= lb, f"{m['mode']}: peak allocated {m['peak_allocated_bytes']} >= "
              f"lower bound {lb}")
        check(m["peak_reserved_bytes"] >= m["peak_allocated_bytes"], f"{m['mode']}: reserved >= allocated")
        check(m["min_capacity_bytes"] is not None and m["min_capacity_bytes"] >= lb,
              f"{m['mode']}: min capacity {m['min_capacity_bytes']} >= lower bound {lb}")
    # Both modes hand out the same rounded sizes. Classic mode's large pool keeps a remainder of up
    # to 1 MiB inside an unsplit block and counts it as allocated (PyTorch's rule), so classic can
    # only be higher; expandable mode splits every remainder >= 512 B, so its peak is the trace's
    # peak plus at most 512 B of rounding per live block.
    check(c["peak_allocated_bytes"] >= e["peak_allocated_bytes"],
          f"classic peak allocated {c['peak_allocated_bytes']} >= expandable {e['peak_allocated_bytes']}")
    check(e["peak_allocated_bytes"] <= lb + 512 * e["allocations"],
          f"expandable peak allocated {e['peak_allocated_bytes']} is the trace's peak {lb} plus rounding")
    check(e["device_syncs"] + e["stream_syncs"] == 0, "expandable: zero synchronizations")
    ratio = e["peak_reserved_bytes"] / e["peak_allocated_bytes"]
    check(ratio <= 1.02, f"TARGET: expandable peak reserved / peak allocated {ratio:.4f} <= 1.02")
    # bench/data's name for it (README quick start line 1) is a link to this file, not a copy.
    short = os.path.join(src, "data", "gpt2small_trainstep.trace.csv")
    check(os.path.islink(short) and os.path.samefile(short, path),
          "bench/data/gpt2small_trainstep.trace.csv is a link to workloads/pytorch's trace")


MALFORMED = [
    # (file text, expected line number)
    ("action,addr,size,stream,time_us\nalloc,1024,512,0,1\nalloc,2048,512\n", 3),
    ("action,addr,size,stream,time_us\nalloc,1024,512,0,1\nfree_completed,1024,abc,0,2\n", 3),
    ("action,addr,size,stream\nalloc,1024,512,0\nalloc,2048,512,0\nexplode,1,1,0\n", 4),
    ("action,addr,size,stream\nalloc,-5,512,0\n", 2),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,512,0x0\n"
     "1,00:00:00.000002,free,zzz,512,0x0\n", 3),
    ("Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000001,allocate,0x1000,512\n", 2),
    ("hello,world\n1,2\n", 1),
]


def t_malformed(bench, wdir, src):
    with tempfile.TemporaryDirectory() as d:
        for i, (text, line) in enumerate(MALFORMED):
            path = os.path.join(d, f"bad{i}.csv")
            with open(path, "w") as f:
                f.write(text)
            p = run([bench, "replay", path, "--no-progress"])
            check(p.returncode == 2, f"bad{i}: exit 2, got {p.returncode} ({p.stderr.strip()})")
            check(f"line {line}:" in p.stderr, f"bad{i}: error names line {line}: {p.stderr.strip()!r}")
            check(p.stdout == "", f"bad{i}: no table printed")
        p = run([bench, "replay", os.path.join(d, "does-not-exist.csv")])
        check(p.returncode == 2 and "cannot open" in p.stderr, "missing file: exit 2 with a message")
        p = run([bench, "replay", "--capacity", "lots", "x.csv"])
        check(p.returncode == 2, "bad --capacity: exit 2")


def t_rmm(bench, wdir, src):
    """An RMM log made here: two streams, a pre-recording free, an allocation failure."""
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    live, cur, peak, t = {}, 0, 0, 0
    rng = 12345
    nxt = 0x7f0000000000
    for i in range(3000):
        rng = (rng * 6364136223846793005 + 1442695040888963407) % 2**64
        t += 1
        ts = f"00:00:{t // 1000000:02d}.{t % 1000000:06d}"
        if live and (rng >> 33) % 100 < 45:
            addr = sorted(live)[(rng >> 20) % len(live)]
            size, stream = live.pop(addr)
            cur -= size
            rows.append(f"7,{ts},free,{addr:#x},{size},{stream:#x}")
        else:
            size = 512 * (1 + (rng >> 40) % 40000)
            stream = 0 if (rng >> 8) % 3 else 0x55aa00
            live[nxt] = (size, stream)
            cur += size
            peak = max(peak, cur)
            rows.append(f"7,{ts},allocate,{nxt:#x},{size},{stream:#x}")
            nxt += size + 4096
    rows.insert(1, "7,00:00:00.000000,free,0xdead000,512,0x0")  # allocated before the log began
    rows.insert(2, "7,00:00:00.000000,allocate failure,0x0,999999999999,0x0")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rmm.csv")
        with open(path, "w") as f:
            f.write("\n".join(rows) + "\n")
        modes = replay_json(bench, path, "--check", "100")
        check(set(modes) == {"expandable", "classic"}, "rmm: both modes")
        for m in modes.values():
            check(m["format"] == "rmm-csv", "rmm: format detected")
            check(m["lower_bound_bytes"] == peak, f"rmm: lower bound {m['lower_bound_bytes']} == {peak}")
            check(m["peak_allocated_bytes"] >= peak, f"rmm {m['mode']}: peak allocated >= lower bound")
            check(m["ooms"] == 0, f"rmm {m['mode']}: no OOM")
        e = modes["expandable"]
        check(e["driver_calls"].get("stream_create", 0) == 0, "stream creation is not counted as replay cost")


def t_kineto(bench, wdir, src):
    """kineto_to_trace.py on a profiler trace made here: CUDA '[memory]' events of two threads out of
    time order, CPU events and a second device to leave out, a free of a block from before the
    window; then the traces it must refuse."""
    conv = os.path.join(src, "scripts", "kineto_to_trace.py")

    def mem(ts, addr, nbytes, dev=0, dtype=1, tid=1, idx=None, with_addr=True):
        args = {"Device Type": dtype, "Device Id": dev, "Bytes": nbytes}
        if with_addr:
            args["Addr"] = addr
        if idx is not None:
            args["Ev Idx"] = idx
        return {"ph": "i", "s": "t", "name": "[memory]", "pid": 9, "tid": tid, "ts": ts, "args": args}

    events = [{"ph": "X", "name": "aten::mm", "ts": 5, "dur": 3, "pid": 9, "tid": 1},
              mem(10, 0x1000, 4 << 20, idx=1),
              mem(11, 0x900, 512, dtype=0, dev=-1),          # host memory: not replayed
              mem(30, 0x1000, -(4 << 20), tid=2, idx=4),     # the autograd thread's, written first
              mem(20, 0x3000, 6 << 20, idx=2),
              mem(20, 0x5000, 2 << 20, idx=3),               # same time stamp: Ev Idx orders
              mem(25, 0x7000, 1 << 20, dev=1),               # another device
              mem(26, 0x9000, 3 << 20, dtype=6, idx=5),      # HIP (ROCm) is GPU memory too
              mem(40, 0xbeef, -512),                         # allocated before the window
              mem(50, 0x1000, 8 << 20, idx=6),
              mem(60, 0x3000, -(6 << 20), idx=7)]
    want = ["alloc,4096,4194304", "alloc,12288,6291456", "alloc,20480,2097152", "alloc,36864,3145728",
            "free_completed,4096,4194304", "free_completed,48879,512", "alloc,4096,8388608",
            "free_completed,12288,6291456"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.pt.trace.json")
        with open(path, "w") as f:
            json.dump({"schemaVersion": 1, "traceEvents": events}, f)
        p = run([sys.executable, conv, path])
        check(p.returncode == 2 and "--device" in p.stderr, f"kineto: two devices need --device: {p.stderr!r}")
        out = os.path.join(d, "t.csv")
        p = run([sys.executable, conv, path, "--device", "0", "-o", out])
        check(p.returncode == 0, f"kineto: exit 0, got {p.returncode}: {p.stderr}")
        with open(out) as f:
            lines = f.read().splitlines()
        check(lines[0] == "action,addr,size,stream,time_us", "kineto: header")
        got = [",".join(line.split(",")[:3]) for line in lines[1:]]
        check(got == want, f"kineto: events in time order, device 0 only: {got}")
        check(all(line.split(",")[3] == "0" for line in lines[1:]), "kineto: stream 0")
        modes = replay_json(bench, out)
        for m in modes.values():
            check(m["lower_bound_bytes"] == 19 << 20, f"kineto {m['mode']}: lower bound 19 MiB, "
                  f"got {m['lower_bound_bytes']}")
            check(m["events"] == 7, f"kineto {m['mode']}: the free from before the window dropped")
        # Gzip is read the same way.
        gz = path + ".gz"
        with open(path, "rb") as f, gzip.open(gz, "wb") as g:
            g.write(f.read())
        p = run([sys.executable, conv, gz, "--device", "0"])
        check(p.returncode == 0 and p.stdout.splitlines() == lines, "kineto: .json.gz gives the same CSV")
        # Refused: no Addr (old profilers), no CUDA memory events, not a trace.
        for name, doc, msg in (("noaddr", {"traceEvents": [mem(1, 0, 64, with_addr=False)]}, "Addr"),
                               ("nomem", {"traceEvents": events[:1]}, "profile_memory"),
                               ("notrace", {"schemaVersion": 1}, "traceEvents")):
            bad = os.path.join(d, name + ".json")
            with open(bad, "w") as f:
                json.dump(doc, f)
            p = run([sys.executable, conv, bad])
            check(p.returncode == 2 and msg in p.stderr, f"kineto: {name} refused with exit 2: {p.stderr!r}")
        # Without "Ev Idx" (file order breaks ties), a free written before its block's allocation
        # in the same microsecond (another thread's) still comes after it: not dropped as a free of
        # an unknown block, the block not left live to the end. A free of a block live before the
        # tie stays first, and so does one that "Ev Idx" puts first (a block from before the window).
        tie = os.path.join(d, "tie.json")
        with open(tie, "w") as f:
            json.dump({"traceEvents": [mem(20, 0x1000, -512, tid=2), mem(20, 0x1000, 512),
                                       mem(21, 0x2000, 1024), mem(30, 0x2000, -1024, tid=2),
                                       mem(30, 0x2000, 2048), mem(40, 0x4000, -64, idx=1),
                                       mem(40, 0x4000, 64, idx=2)]}, f)
        p = run([sys.executable, conv, tie])
        got = [",".join(line.split(",")[:3]) for line in p.stdout.splitlines()[1:]]
        check(p.returncode == 0 and got == ["alloc,4096,512", "free_completed,4096,512", "alloc,8192,1024",
                                            "free_completed,8192,1024", "alloc,8192,2048",
                                            "free_completed,16384,64", "alloc,16384,64"],
              f"kineto: a same-microsecond free after its allocation: {got} {p.stderr!r}")
        # Refused, naming the event: time stamps that are no time (json reads NaN and Infinity) and
        # negative addresses; no CSV is left behind.
        for name, ev, msg in (("nan", mem(float("nan"), 0x1000, 64), "ts"),
                              ("inf", mem(float("inf"), 0x1000, 64), "ts"),
                              ("negaddr", mem(1, -4096, 64), "Addr"),
                              ("nulldev", mem(1, 0x1000, 64, dev=None), "Device Id"),
                              ("nullidx", mem(1, 0x1000, 64, idx=[1]), "Ev Idx")):
            bad = os.path.join(d, name + ".json")
            with open(bad, "w") as f:
                json.dump({"traceEvents": [mem(0, 0x2000, 64), ev]}, f)
            csv = os.path.join(d, name + ".csv")
            p = run([sys.executable, conv, bad, "-o", csv])
            check(p.returncode == 2 and msg in p.stderr and "event 1" in p.stderr and not os.path.exists(csv),
                  f"kineto: {name} refused with exit 2: {p.returncode} {p.stderr!r}")


def converted(src, pickle_path):
    p = run([sys.executable, os.path.join(src, "scripts", "snapshot_to_trace.py"), pickle_path])
    return p


def replay_stream(text):
    """(action, addr, size, stream) of the lines that drive a replay, and per-action counts."""
    lines = text.splitlines()[1:]
    counts = collections.Counter(line.split(",")[0] for line in lines)
    drive = [tuple(line.split(",")[:4]) for line in lines if line.split(",")[0] in ("alloc", "free_completed")]
    return drive, counts


def t_converter(bench, wdir, src):
    pk = workload(wdir, PICKLE)
    csv = workload(wdir, TRACE)
    p = converted(src, pk)
    check(p.returncode == 0, f"converter exit 0, got {p.returncode}: {p.stderr}")
    got, got_counts = replay_stream(p.stdout)
    with open(csv) as f:
        want, want_counts = replay_stream(f.read())
    check(got_counts == want_counts, f"converter: action counts {dict(got_counts)} == {dict(want_counts)}")
    check(len(got) == len(want) and got == want, f"converter: same alloc/free_completed stream "
          f"({len(got)} vs {len(want)} entries)")
    # Classes are refused, not instantiated.
    with tempfile.TemporaryDirectory() as d:
        evil = os.path.join(d, "evil.pickle")
        with open(evil, "wb") as f:
            pickle.dump({"device_traces": [[collections.OrderedDict(action="alloc")]]}, f)
        p = converted(src, evil)
        check(p.returncode == 2 and "refusing to load class" in p.stderr,
              f"converter refuses classes with exit 2: rc={p.returncode} {p.stderr.strip()!r}")
        notsnap = os.path.join(d, "list.pickle")
        with open(notsnap, "wb") as f:
            pickle.dump([1, 2, 3], f)
        p = converted(src, notsnap)
        check(p.returncode == 2 and "not a memory snapshot" in p.stderr, "converter rejects a non-snapshot")
        p = run([bench, "replay", evil, "--no-progress"])
        check(p.returncode == 2, f"vmm-bench on a pickle with classes: exit 2, got {p.returncode}")


def t_pickle_replay(bench, wdir, src):
    a = replay_json(bench, workload(wdir, PICKLE))
    b = replay_json(bench, workload(wdir, TRACE))
    for mode in ("expandable", "classic"):
        check(a[mode]["format"] == "pytorch-snapshot", "pickle detected")
        for key in ("events", "allocations", "lower_bound_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                    "ooms", "driver_calls"):
            check(a[mode][key] == b[mode][key], f"{mode}: pickle and CSV replays agree on {key}: "
                  f"{a[mode][key]} vs {b[mode][key]}")


def t_snapshot_peak(bench, wdir, src):
    """--snapshot-at-peak writes the allocator's snapshot where reserved bytes first reach their peak:
    its segments add up to the replay's peak of reserved bytes, in each mode; refused with both
    modes, --handles, or a file that cannot be written."""
    sys.path.insert(0, os.path.join(src, "scripts"))
    from snapshot_to_trace import load_snapshot  # its unpickler refuses every class
    path = workload(wdir, TRACE)
    with tempfile.TemporaryDirectory() as d:
        for mode in ("expandable", "classic"):
            out = os.path.join(d, mode + ".pickle")
            p = run([bench, "replay", path, "--mode", mode, "--json", "--no-progress", "--snapshot-at-peak", out])
            check(p.returncode == 0, f"{mode}: exit {p.returncode}: {p.stderr[-300:]}")
            if p.returncode != 0:
                continue
            r = json.loads(p.stdout.splitlines()[0])
            check(len(p.stdout.splitlines()) == 1, f"{mode}: stdout is the JSON line only")
            check(f"wrote {out}" in p.stderr and "after event" in p.stderr, f"{mode}: says where: {p.stderr!r}")
            s = load_snapshot(out)
            segs = s["segments"]
            mapped = sum(g["total_size"] for g in segs)
            active = sum(b["size"] for g in segs for b in g["blocks"] if b["state"].startswith("active"))
            check(mapped == r["peak_reserved_bytes"],
                  f"{mode}: segments {mapped} B = peak reserved {r['peak_reserved_bytes']} B")
            check(0 < active <= r["peak_allocated_bytes"],
                  f"{mode}: {active} B active, at most the peak allocated {r['peak_allocated_bytes']} B")
        out = os.path.join(d, "no.pickle")
        for extra in (["--mode", "both"], ["--handles"]):
            p = run([bench, "replay", path, "--no-progress", *extra, "--snapshot-at-peak", out])
            check(p.returncode == 2 and "--snapshot-at-peak goes with" in p.stderr, f"{extra} refused: {p.returncode}")
        check(not os.path.exists(out), "nothing written when refused")
        bad = os.path.join(d, "missing-dir", "x.pickle")
        p = run([bench, "replay", path, "--mode", "expandable", "--no-progress", "--snapshot-at-peak", bad])
        check(p.returncode == 1 and "cannot write" in p.stderr, f"unwritable path: exit {p.returncode}, {p.stderr[-200:]!r}")


def t_synthetic(bench, wdir, src):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "syn.csv")
        p = run([bench, "gen", "20000", path, "--seed", "3"])
        check(p.returncode == 0, f"gen exit 0: {p.stderr}")
        with open(path) as f:
            n = sum(1 for _ in f) - 1
        check(n in (19999, 20000), f"gen wrote 20000 events, got {n}")
        lb = lower_bound_csv(path)
        modes = replay_json(bench, path, "--check", "1000", "--min-capacity")
        for m in modes.values():
            check(m["events"] == n, f"synthetic {m['mode']}: all {n} events replayed, got {m['events']}")
            check(m["lower_bound_bytes"] == lb, f"synthetic: lower bound {m['lower_bound_bytes']} == {lb}")
            check(m["ooms"] == 0, f"synthetic {m['mode']}: no OOM")
            check(m["min_capacity_bytes"] >= lb, f"synthetic {m['mode']}: min capacity >= lower bound")
        # At a capacity below the lower bound every mode must OOM.
        modes = replay_json(bench, path, "--capacity", str(max(2 << 20, (lb // 2) >> 21 << 21)))
        for m in modes.values():
            check(m["ooms"] > 0, f"synthetic {m['mode']}: OOMs below the lower bound")


def t_handles(bench, wdir, src):
    """--handles: the default beside the fixed sizes and max_handle_size:20M, per-pool peaks, the
    steady-cost driver time and a line per column against the fragmentation targets."""
    path = workload(wdir, TRACE)
    modes = replay_json(bench, path, "--handles")
    check(set(modes) == {"default", "2M handles", "20M pages", "20M by need"}, f"four columns, got {sorted(modes)}")
    d, two = modes["default"], modes["2M handles"]
    for key in ("peak_reserved_bytes", "driver_time_ns", "driver_calls"):
        check(d[key] == two[key], f"the default maps one handle per page: {key} {d[key]} == {two[key]}")
    for m in modes.values():
        for pool in ("small", "large"):
            check(m[f"peak_reserved_{pool}_bytes"] >= m[f"peak_allocated_{pool}_bytes"] > 0,
                  f"{m['mode']}: {pool} pool reserved >= allocated > 0")
        check(0 < m["driver_time_steady_ns"] < m["driver_time_ns"], f"{m['mode']}: steady costs below cold ones")
    check(modes["20M by need"]["driver_calls"]["mem_create"] < d["driver_calls"]["mem_create"],
          "20M handles by need create fewer handles than one per page")
    p = run([bench, "replay", path, "--handles", "--no-progress"])
    check(p.returncode == 0, f"--handles exit 0: {p.stderr}")
    lines = [l for l in p.stdout.splitlines() if l.startswith(("default ", "2M handles ", "20M pages ", "20M by need "))]
    check(len(lines) == 4 and all("held/handed" in l and "driver time" in l for l in lines),
          f"a targets line per column: {lines}")


def t_plot(bench, wdir, src):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "p.svg")
        p = run([bench, "replay", workload(wdir, TRACE), "--plot", out, "--no-progress"])
        check(p.returncode == 0, f"plot exit 0: {p.stderr}")
        check(os.path.isfile(out) and open(out).read(200).lstrip().startswith("<?xml"), "svg written")
        check("Verdict:" in p.stdout, "table has a verdict line")


def t_latency(bench, wdir, src):
    p = run([bench, "latency", "--quick", "--max-live", "1000", "--threads", "2", "--json"])
    check(p.returncode == 0, f"latency exit 0: {p.stderr}")
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    cells = {(r["pattern"], r["threads"], r["live"], r["allocator"]) for r in rows}
    want = {(pat, th, live, al) for pat in ("small", "large", "mixed", "ring") for th in (1, 2) for live in (100, 1000)
            for al in ("expandable", "classic", "glibc", "jemalloc")}
    check(cells == want, f"latency: every cell reported ({len(cells)} of {len(want)})")
    for r in rows:
        if r["allocator"] in ("expandable", "classic") or r["pattern"] == "small":
            check("median_ns" in r, f"latency: {r} measured")
        if "median_ns" in r:
            check(0 < r["median_ns"] <= r["p99_ns"], f"latency: 0 < median <= p99 in {r}")
            check(r.get("aggregate_mpairs_s", 0) > 0, f"latency: aggregate throughput in {r}")
            if r["allocator"] != "glibc":
                check("ratio_to_glibc" in r or "skipped" in r, f"latency: ratio present in {r}")
    # --conf reaches vmmalloc's cells (lanes:false: one lock), and a bad key is refused up front
    p = run([bench, "latency", "--quick", "--max-live", "100", "--threads", "2", "--json", "--conf", "lanes:false"])
    check(p.returncode == 0, f"latency --conf lanes:false exit 0: {p.stderr}")
    p = run([bench, "latency", "--quick", "--conf", "no_such_key:1"])
    check(p.returncode == 2 and "no_such_key" in p.stderr, f"latency --conf no_such_key: exit 2 with the key named: {p.returncode} {p.stderr}")


def t_growth(bench, wdir, src):
    p = run([bench, "growth", "--quick", "--json"])
    check(p.returncode == 0, f"growth exit 0: {p.stderr}")
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.strip()]
    rows = {r["grow_unlocked"]: r for r in lines if r.get("bench") == "growth"}
    calls = {r["lanes"]: r for r in lines if r.get("bench") == "growth_calls"}
    check(set(calls) == {True, False}, f"growth: both lanes settings reported: {sorted(calls)}")
    if set(calls) == {True, False}:
        for r in calls.values():
            check(r["pairs"] > 0 and 0 < r["median_us"] <= r["p99_us"] <= r["max_us"], f"growth: sane row {r}")
        # every pair after the lanes opened ran on its lane; without lanes none did (timing is not
        # checked here: the VM's scheduling decides the longest pair; docs/benchmarks.md has runs)
        check(calls[True]["lane_mallocs"] >= calls[True]["pairs"],
              f"growth: pairs on their lane {calls[True]['lane_mallocs']} of {calls[True]['pairs']}")
        check(calls[False]["lane_mallocs"] == 0, f"growth: lanes:false made lane mallocs")
    check(set(rows) == {True, False}, f"growth: both settings reported: {sorted(rows)}")
    if set(rows) == {True, False}:
        for r in rows.values():
            check(r["pairs"] > 0 and 0 < r["median_us"] <= r["p99_us"] <= r["max_us"], f"growth: sane row {r}")
        # with the lock held across the creates, a pair that meets a growth waits for at least one
        # create (193 us, in real time here); how many pairs get done varies with the lock's handoffs
        check(rows[False]["max_us"] >= 150,
              f"growth: the lock held across creates makes a pair wait for one ({rows[False]['max_us']} us)")



def t_handoff(bench, wdir, src):
    p = run([bench, "handoff", "--quick", "--json"])
    check(p.returncode == 0, f"handoff exit 0: {p.stderr}")
    rows = {r["allocator"]: r for r in (json.loads(l) for l in p.stdout.splitlines() if l.strip())
            if r.get("bench") == "handoff"}
    want = {"vmmalloc", "vmmalloc_no_depot", "glibc", "jemalloc", "queue"}
    check(set(rows) == want, f"handoff: every allocator reported: {sorted(rows)}")
    if set(rows) == want:
        for r in rows.values():
            check(0 < r["min"] <= r["mpairs_per_s"] <= r["max"], f"handoff: sane row {r}")
        # with the depot some of the producer's mallocs are cache hits (0.8 with the two threads on
        # the two cores, 0.3 when they share one: bursts of 1024 frees, more than the depot holds),
        # without it every one goes to the lane (throughput is not checked: docs/benchmarks.md)
        check(rows["vmmalloc"]["cache_hits_per_malloc"] > 0.1,
              f"handoff: depot hits {rows['vmmalloc']['cache_hits_per_malloc']}")
        check(rows["vmmalloc_no_depot"]["cache_hits_per_malloc"] == 0 and
              rows["vmmalloc_no_depot"]["lane_mallocs_per_malloc"] > 0.99,
              f"handoff: without the depot, mallocs on the lane: {rows['vmmalloc_no_depot']}")
    # --exchange: both threads malloc and free each other's blocks. A block one thread's cache handed
    # out is kept by the other's cache when freed (tcache.c, named_elsewhere_live): about half the
    # frees in Release, 0.27 under the thread sanitizer (its trylocks fail more often); with a busy
    # loop on one of the two vCPUs 0.26 in Release and 0.03 under the thread sanitizer (the threads
    # take turns, and most mallocs then come from the lane, whose blocks name no cache); exactly 0
    # before that change (every such free went to the allocator). Cache hits: a sanity bound only.
    p = run([bench, "handoff", "--quick", "--exchange", "--json"])
    check(p.returncode == 0, f"handoff --exchange exit 0: {p.stderr}")
    rows = {r["allocator"]: r for r in (json.loads(l) for l in p.stdout.splitlines() if l.strip())
            if r.get("bench") == "handoff" and r.get("pattern") == "exchange"}
    check(set(rows) == want, f"handoff --exchange: every allocator reported: {sorted(rows)}")
    if "vmmalloc" in rows:
        v = rows["vmmalloc"]
        check(v["frees_kept_from_others_per_free"] > 0,
              f"handoff --exchange: frees kept from other caches {v['frees_kept_from_others_per_free']}")
        check(v["cache_hits_per_malloc"] > 0.2, f"handoff --exchange: cache hits {v['cache_hits_per_malloc']}")
    p = run([bench, "handoff", "--pairs", "0"])
    check(p.returncode == 2 and "--pairs" in p.stderr, f"handoff --pairs 0: exit 2: {p.returncode} {p.stderr}")

def t_generators(bench, wdir, src):
    """The synthetic trace generators of docs/benchmarks.md ("Handle sizes") write traces that
    replay: every block freed by the end, replayed with vmm_check, and the variable-length training
    run's activation sizes change from step to step; repeat_step.py lengthens a recorded run
    without changing its live peak."""
    gens = [("gen_streams_trace.py", ["--layers", "3"]), ("gen_offload_trace.py", ["--layers", "2"]),
            ("gen_varlen_trace.py", ["--steps", "4", "--layers", "2", "--d-model", "256", "--vocab", "1000"]),
            ("gen_varlen_trace.py", ["--steps", "3", "--layers", "2", "--d-model", "256", "--vocab", "1000", "--bf16"])]
    with tempfile.TemporaryDirectory() as d:
        for gen, args in gens:
            path = os.path.join(d, gen.replace(".py", ".csv"))
            p = run([sys.executable, os.path.join(src, "scripts", gen), *args, "-o", path])
            check(p.returncode == 0, f"{gen} {' '.join(args)} exit 0: {p.stderr.strip()}")
            if p.returncode:
                continue
            live, sizes = {}, set()
            with open(path) as f:
                next(f)
                for line in f:
                    action, addr, size = line.split(",")[:3]
                    if action == "alloc":
                        check(addr not in live, f"{gen}: address {addr} allocated twice")
                        live[addr] = size
                        sizes.add(int(size))
                    else:
                        check(live.pop(addr, None) == size, f"{gen}: free of a live block of its size ({addr})")
            check(not live, f"{gen}: every block freed by the end ({len(live)} left)")
            m = replay_json(bench, path, "--mode", "expandable", "--check", "500")["expandable"]
            check(m["ooms"] == 0 and m["peak_allocated_bytes"] > 0, f"{gen}: replays without OOM")
            if gen == "gen_varlen_trace.py":
                check(len(sizes) > 30, f"{gen}: activation sizes vary with the sequence length ({len(sizes)} sizes)")
        # repeat_step.py: a recorded three-step run lengthened to ten steps keeps its live peak
        step = os.path.join(wdir, "cs336_niu_train3_ctx100.trace.csv")
        if os.path.isfile(step):
            path = os.path.join(d, "repeat.csv")
            p = run([sys.executable, os.path.join(src, "scripts", "repeat_step.py"), step, "--times", "10", "-o", path])
            check(p.returncode == 0 and "0 frees without a match" in p.stderr, f"repeat_step.py: {p.stderr.strip()}")
            orig = replay_json(bench, step, "--mode", "expandable")["expandable"]
            m = replay_json(bench, path, "--mode", "expandable", "--check", "2000")["expandable"]
            check(m["ooms"] == 0 and m["peak_allocated_bytes"] == orig["peak_allocated_bytes"],
                  f"repeat_step.py: the same live peak ({m['peak_allocated_bytes']} == {orig['peak_allocated_bytes']})")
            check(m["allocations"] > 3 * orig["allocations"], "repeat_step.py: the step repeated")


# The traces of 1 GB or more in workloads/pytorch that miss the fragmentation targets today, with
# the figures they must not exceed (docs/benchmarks.md, "Handle sizes": held/handed, min capacity
# over the lower bound). Every other such trace must meet both targets.
KNOWN_MISSES = {
    "cs336_niu_train3_ctx200.trace.csv": (1.0488, 1.0351),
    "cs336_nothanmin_forward.trace.csv": (1.0072, 1.0070),
    "kineto_hta_ddp_compiled_rank1.trace.csv": (1.0242, 1.0234),
    "kineto_tracelens_h100_qwen15_05b_chat.trace.csv": (1.0887, 1.0925),
    "kineto_tracelens_mi300_qwen15_05b_chat.trace.csv": (1.0896, 1.0952),
    "kineto_tracelens_h100_owlv2_large.trace.csv": (1.01, 1.0062),
    "kineto_tracelens_mi300_owlv2_large.trace.csv": (1.01, 1.0062),
}
HELD_TARGET, MIN_CAPACITY_TARGET = 1.01, 1.005


def t_targets(bench, wdir, src):
    """Fragmentation targets 1 and 2 (issue "Fragmentation first") on every recorded trace of 1 GB
    or more in workloads/pytorch, replayed on the simulated 80 GiB device: peak reserved / peak
    allocated <= 1.01 and the smallest capacity that completes <= 1.005x the lower bound, or no
    worse than today's figure for the known misses. A placement or recycling change that loosens a
    real trace past a target fails here."""
    names = sorted(n for n in os.listdir(wdir) if n.endswith(".trace.csv"))
    check(len(names) >= 30, f"workloads/pytorch holds the recorded traces ({len(names)} found)")
    big = 0
    for name in names:
        p = run([bench, "replay", os.path.join(wdir, name), "--mode", "expandable", "--min-capacity",
                 "--json", "--no-progress"])
        if p.returncode != 0:
            check(False, f"{name}: replay exited {p.returncode}: {p.stderr.strip()}")
            continue
        m = json.loads(p.stdout.splitlines()[0])
        if m["lower_bound_bytes"] < 1e9:
            continue
        big += 1
        held, mincap = m["reserved_over_allocated"], m["min_capacity_over_lower_bound"]
        held_max, mincap_max = KNOWN_MISSES.get(name, (HELD_TARGET, MIN_CAPACITY_TARGET))
        check(held <= held_max + 5e-5, f"{name}: held/handed {held:.4f} <= {held_max}")
        check(mincap <= mincap_max + 5e-5, f"{name}: min capacity {mincap:.4f}x <= {mincap_max}x")
        check(m["ooms"] == 0, f"{name}: no OOM on 80 GiB")
    for name in KNOWN_MISSES:
        check(name in names, f"known miss {name} is in workloads/pytorch")
    check(big >= 20, f"at least 20 traces of 1 GB or more replayed ({big})")


TESTS = {name[2:]: fn for name, fn in globals().items() if name.startswith("t_")}


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in TESTS:
        sys.exit(f"usage: bench_smoke.py {{{','.join(TESTS)}}} VMM_BENCH WORKLOADS_DIR BENCH_SOURCE_DIR")
    TESTS[sys.argv[1]](*sys.argv[2:])
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print(f"{sys.argv[1]}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
