"""The vmmalloc Python package without PyTorch: run by tests/test_pytorch_python.c with
VMMALLOC_LIB pointing at the built shared library and VMMALLOC_CONF selecting the simulated driver.
Exits 0 when every check passes, 1 otherwise (each failure printed)."""

import os
import sys

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def raises(exc, fn, *args):
    try:
        fn(*args)
    except exc as e:
        return e
    return None


import vmmalloc  # noqa: E402
import vmmalloc.torch as vt  # noqa: E402

check("torch" not in sys.modules, "importing vmmalloc.torch must not import torch")
lib = vmmalloc.load()
check(os.path.samefile(vmmalloc.loaded_path(), os.environ["VMMALLOC_LIB"]), "library from VMMALLOC_LIB")

# bad conf: a clear error naming the key
e = raises(vmmalloc.VmmError, vmmalloc.configure, "bogus_key:1")
check(e is not None and e.status == "ECONFIG" and "bogus_key" in str(e), "bad conf -> ECONFIG: %r" % e)
vmmalloc.configure("sim_backed:true")

# the PyTorch entry points, as PyTorch calls them
p = lib.vmm_torch_malloc(3 << 20, 0, None)
q = lib.vmm_torch_malloc(1000, 0, None)
check(bool(p) and bool(q), "vmm_torch_malloc returns pointers")

TORCH_FAMILIES = ["allocation", "segment", "active", "inactive_split", "allocated_bytes",
                  "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"]
stats = vt.memory_stats(0)
missing = ["%s.%s.%s" % (f, pool, m) for f in TORCH_FAMILIES
           for pool in ("all", "large_pool", "small_pool")
           for m in ("current", "peak", "allocated", "freed")
           if "%s.%s.%s" % (f, pool, m) not in stats]
missing += [k for k in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                        "num_device_free", "max_split_size", "num_event_waits") if k not in stats]
check(not missing, "PyTorch stats keys missing: %s" % missing[:10])
check(stats.get("allocation.all.current") == 2, "two live blocks: %r" % stats.get("allocation.all.current"))
check(stats.get("allocation.large_pool.current") == 1 and stats.get("allocation.small_pool.current") == 1,
      "one large, one small")
check(stats.get("requested_bytes.all.current") == (3 << 20) + 1000, "requested bytes")
check(list(stats) == sorted(stats), "keys sorted like torch.cuda.memory_stats()")

# record_stream on a live block, and on something else
vt.record_stream(p, 0)
e = raises(vmmalloc.VmmError, vt.record_stream, p + 16, None)
check(e is not None and e.status == "EBADPTR", "record_stream(interior) -> EBADPTR: %r" % e)

lib.vmm_torch_free(p, 3 << 20, 0, None)
lib.vmm_torch_free(q, 1000, 0, None)
stats = vmmalloc.memory_stats(0)
check(stats["allocation.all.current"] == 0 and stats["allocated_bytes.all.peak"] >= 3 << 20, "after free")
vt.reset_peak_memory_stats(0)
check(vmmalloc.memory_stats(0)["allocated_bytes.all.peak"] == 0, "reset peaks")
vt.empty_cache()
vt.empty_cache(0)

# configure is refused once an allocator exists
e = raises(vmmalloc.VmmError, vmmalloc.configure, "sim_backed:false")
check(e is not None and e.status == "EINVAL", "configure after first use -> EINVAL: %r" % e)

# out of memory: NULL and a report
check(vt.oom_report() == "", "no OOM report before an OOM")
big = lib.vmm_torch_malloc(4 << 30, 1, None)
check(big is None, "4 GiB on a 1 GiB device fails")
rep = vt.oom_report()
check("out of memory" in rep and "4096.00 MiB" in rep, "OOM report: %r" % rep[:200])
check(vmmalloc.memory_stats(1)["num_ooms"] == 1, "num_ooms counted")
check(vmmalloc.last_error() != "", "last_error set")

# pinned stats (the cache exists once pinned memory is used; zeros before)
ps = vt.pinned_stats(0)
check(ps.get("pinned.reserved_bytes.current") == 0 and "pinned.num_host_alloc" in ps, "pinned stats: %r" % ps)

# history and snapshots on device 2 (a fresh allocator): record, allocate, free, snapshot
vt.record_memory_history(64, 2)
s1 = lib.vmm_torch_malloc(5 << 20, 2, None)
s2 = lib.vmm_torch_malloc(700, 2, None)
lib.vmm_torch_free(s2, 700, 2, None)
snap = vt.snapshot(device=2)
check(isinstance(snap, dict) and set(snap) >= {"segments", "device_traces", "allocator_settings"},
      "snapshot keys: %r" % sorted(snap) if isinstance(snap, dict) else snap)
blocks = [b for seg in snap.get("segments", []) for b in seg["blocks"]]
live = [b for b in blocks if b["state"] == "active_allocated"]
check([(b["address"], b["requested_size"]) for b in live] == [(s1, 5 << 20)],
      "the one live block in the snapshot: %r" % live)
# the ordinal is the driver's (the simulated driver has one device, reported as 0): one trace
# list per ordinal up to it, the last one this allocator's
traces = snap.get("device_traces", [])
check(traces and all(seg["device"] == len(traces) - 1 for seg in snap.get("segments", [])),
      "segments' device matches the trace lists: %d" % len(traces))
trace = traces[-1] if traces else []
acts = [(t["action"], t["addr"]) for t in trace]
check(("alloc", s1) in acts and ("alloc", s2) in acts and ("free_requested", s2) in acts,
      "trace holds the allocs and the free: %r" % acts)
check(snap.get("allocator_settings", {}).get("allocator") == "vmmalloc", "allocator_settings")
# the ring keeps the newest entries: resize to 1, then stop
vt.record_memory_history(1, 2)
check(len(vt.snapshot(device=2)["device_traces"][-1]) == 1, "history resized to 1 entry")
vt.record_memory_history(0, 2)
check(vt.snapshot(device=2)["device_traces"][-1] == [], "history off: empty trace")
# device 0 never recorded: its trace is empty
check(all(t == [] for t in vt.snapshot(device=0)["device_traces"]), "device 0 without history")
# with a path: the pickle on disk, the same state, read back by the restricted loader
import tempfile  # noqa: E402
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "s.pickle")
    check(vt.snapshot(path, 2) is None, "snapshot(path) returns None")
    disk = vmmalloc.load_snapshot(path)
    check([b["address"] for seg in disk["segments"] for b in seg["blocks"]
           if b["state"] == "active_allocated"] == [s1], "snapshot file: the live block")
    # the restricted unpickler refuses anything naming a class
    import pickle  # noqa: E402
    evil = os.path.join(d, "evil.pickle")
    with open(evil, "wb") as f:
        pickle.dump({"segments": [os.getcwd]}, f, protocol=2)
    e = raises(pickle.UnpicklingError, vmmalloc.load_snapshot, evil)
    check(e is not None and "only plain data" in str(e), "class reference refused: %r" % e)
    e = raises(vmmalloc.VmmError, vt.snapshot, os.path.join(d, "no-such-dir", "s.pickle"), 2)
    check(e is not None and e.status == "EINVAL" and "no-such-dir" in str(e),
          "unwritable path -> EINVAL naming it: %r" % e)
e = raises(vmmalloc.VmmError, vt.snapshot, None, 99)
check(e is not None and e.status == "EINVAL" and "device 99" in str(e), "bad device: %r" % e)
e = raises(vmmalloc.VmmError, vt.record_memory_history, 8, -3)
check(e is not None and e.status == "EINVAL", "record_memory_history bad device: %r" % e)
lib.vmm_torch_free(s1, 5 << 20, 2, None)

# install needs torch; without it, a clear ImportError
try:
    import torch  # noqa: F401
    have_torch = True
except ImportError:
    have_torch = False
if not have_torch:
    e = raises(ImportError, vt.install)
    check(e is not None and "PyTorch is not installed" in str(e), "install without torch: %r" % e)
    check(not vt.is_installed(), "not installed")

# a missing library is reported clearly
e = raises(FileNotFoundError, vmmalloc.library_path, "/nonexistent/libvmmalloc.so")
check(e is not None and "does not exist" in str(e), "missing lib_path")

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
