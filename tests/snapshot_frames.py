"""Call stacks in snapshots, through the Python package on the simulated driver (no PyTorch): run by
tests/api/test_snapshot_frames.c with VMMALLOC_LIB set to the built library.

A PyTorch op reaches the allocator from C++ while its Python caller waits; here ctypes plays that
part: ctypes.PyDLL calls keep the GIL (like a tensor freed by Python), ctypes.CDLL calls release
it (like PyTorch's op bindings). Checked, each through tests/snapshot_check.py (PyTorch's format
and its viewer, replayed step by step):

- stacks="all": blocks and alloc / free entries carry the Python frames of the function that
  allocated, with the right file and line, below the native frames of libffi and _ctypes; no frame
  of libvmmalloc itself; the same with the GIL released (gathered before the allocator's lock);
- stacks="python": Python frames only; stacks="native": native frames only, the interpreter's
  included; context="alloc": frees without frames; context="state": no trace frames at all;
- frames of another Python thread; an allocation while an exception is being handled (the
  exception survives); a Python stack deeper than the 96 frames kept;
- the cyclic GC: with threshold 1 and cycles whose finalizers free vmmalloc blocks, allocating with
  stacks on must neither deadlock (a collection under the allocator's lock would re-enter it) nor
  lose a block;
- the cost: malloc + free pairs per stacks setting are printed (docs/snapshots.md quotes them).
Exits 0 when every check passes, 1 otherwise.
"""
import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time

ROOT = os.environ.get("VMM_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import snapshot_check  # noqa: E402
import vmmalloc  # noqa: E402

THIS = os.path.abspath(__file__)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)
    return cond


LIB = vmmalloc.load()
PATH = vmmalloc.loaded_path()
GIL = ctypes.PyDLL(PATH)     # keeps the GIL during the call
NOGIL = ctypes.CDLL(PATH)    # releases it
for L in (GIL, NOGIL):
    L.vmm_torch_malloc.restype = ctypes.c_void_p
    L.vmm_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    L.vmm_torch_free.restype = None
    L.vmm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

LINES = {}


def alloc_with_gil(size):
    LINES["alloc_with_gil"] = sys._getframe().f_lineno + 1
    return GIL.vmm_torch_malloc(size, 0, None)


def alloc_without_gil(size):
    LINES["alloc_without_gil"] = sys._getframe().f_lineno + 1
    return NOGIL.vmm_torch_malloc(size, 0, None)


def free_with_gil(p, size):
    LINES["free_with_gil"] = sys._getframe().f_lineno + 1
    GIL.vmm_torch_free(p, size, 0, None)


def frames_of(snap, addr):
    for s in snap["segments"]:
        for b in s["blocks"]:
            if b["address"] == addr:
                return b["frames"]
    return None


def trace_frames(snap, action, addr):
    return [e["frames"] for e in snap["device_traces"][0] if e["action"] == action and e["addr"] == addr]


def expect_for(snap, live, stacked, **extra):
    """EXPECT dict for snapshot_check.check from the snapshot's own sums (the C test checks those
    against the stats; here the point is frames and the viewer)."""
    segs = snap["segments"]
    exp = {"device": 0, "expandable": True, "page_size_min": 2 << 20,
           "segment_bytes": sum(s["total_size"] for s in segs),
           "allocated_bytes": sum(s["allocated_size"] for s in segs),
           "active_bytes": sum(s["active_size"] for s in segs),
           "trace_len": len(snap["device_traces"][0]), "trace_actions": ["alloc"],
           "live": live, "pending": [], "groups": [], "stacked": stacked}
    exp.update(extra)
    return exp


def block_entry(snap, p, requested):
    for s in snap["segments"]:
        for b in s["blocks"]:
            if b["address"] == p:
                return [p, b["size"], requested]
    return [p, 0, requested]


def viewer_check(snap, exp, tag):
    for msg in snapshot_check.check(snap, exp):
        check(False, "%s: snapshot_check: %s" % (tag, msg))


def names(frames):
    return [f["name"] for f in frames or []]


def scenario_all():
    vmmalloc.empty_cache(0)
    t0 = int(time.time() * 1e6)
    vmmalloc.record_memory_history(10000, 0, stacks="all")
    a = alloc_with_gil(3 << 20)
    b = alloc_without_gil(5 << 20)
    c = alloc_with_gil(1000)
    free_with_gil(c, 1000)
    snap = vmmalloc.snapshot(device=0)
    fa, fb = frames_of(snap, a), frames_of(snap, b)
    check(fa and fa[0]["filename"] != THIS, "stacks=all: native frames first: %s" % names(fa))
    check("alloc_with_gil" in names(fa) and "scenario_all" in names(fa),
          "stacks=all, GIL held: Python frames missing: %s" % names(fa))
    check(any(f["name"] == "ffi_call" for f in fa or []), "stacks=all: no native frame of libffi: %s" % names(fa))
    py = [f for f in fa or [] if f["filename"] == THIS]
    check(py and py[0]["name"] == "alloc_with_gil" and py[0]["line"] == LINES["alloc_with_gil"],
          "stacks=all: innermost Python frame %s, expected alloc_with_gil:%d" % (py[:1], LINES["alloc_with_gil"]))
    # Python frames of an op that released the GIL: gathered before the lock (vmm_malloc)
    check("alloc_without_gil" in names(fb), "stacks=all, GIL released: Python frames missing: %s" % names(fb))
    check(not any("libvmmalloc" in f["filename"] for f in snapshot_check.all_frames(snap)),
          "frames of libvmmalloc itself in the snapshot")
    fr = trace_frames(snap, "free_requested", c)
    check(fr and "free_with_gil" in names(fr[0]), "free_requested frames: %s" % fr)
    live = [block_entry(snap, a, 3 << 20), block_entry(snap, b, 5 << 20)]
    viewer_check(snap, expect_for(snap, live, [a, b], frames="some", time_window=[t0, int(time.time() * 1e6) + 1],
                                  frame_files=[os.path.basename(THIS)], no_frame_files=["libvmmalloc"],
                                  python_lines={"alloc_with_gil": LINES["alloc_with_gil"]},
                                  trace_actions=["alloc", "free_requested", "free_completed", "segment_map"]),
                 "stacks=all")
    return [(a, 3 << 20), (b, 5 << 20)]


def scenario_modes(live):
    # python only: the first frame is Python
    vmmalloc.record_memory_history(10000, 0, stacks="python")
    p = alloc_with_gil(7000)
    snap = vmmalloc.snapshot(device=0)
    f = frames_of(snap, p)
    check(f and all(x["filename"].endswith(".py") for x in f) and f[0]["name"] == "alloc_with_gil",
          "stacks=python: %s" % [(x["filename"], x["name"]) for x in f or []])
    free_with_gil(p, 7000)
    # native only: the interpreter's own frames, no Python ones
    vmmalloc.record_memory_history(10000, 0, stacks="native")
    p = alloc_with_gil(7000)
    snap = vmmalloc.snapshot(device=0)
    f = frames_of(snap, p)
    check(f and not any(x["filename"] == THIS for x in f) and any("ffi_call" == x["name"] for x in f),
          "stacks=native: %s" % names(f))
    free_with_gil(p, 7000)
    # context alloc: frees carry none; context state: no trace frames, blocks keep theirs
    vmmalloc.record_memory_history(0, 0)  # a new ring: resizing would keep the entries above
    vmmalloc.record_memory_history(10000, 0, stacks="all", context="alloc")
    p = alloc_with_gil(9000)
    free_with_gil(p, 9000)
    snap = vmmalloc.snapshot(device=0)
    check(trace_frames(snap, "alloc", p) and trace_frames(snap, "alloc", p)[-1], "context=alloc: alloc without frames")
    check(trace_frames(snap, "free_requested", p) == [[]], "context=alloc: free with frames")
    vmmalloc.record_memory_history(0, 0)
    vmmalloc.record_memory_history(10000, 0, stacks="all", context="state")
    p = alloc_with_gil(9000)
    snap = vmmalloc.snapshot(device=0)
    check(all(not e["frames"] for e in snap["device_traces"][0]), "context=state: trace entries with frames")
    check("alloc_with_gil" in names(frames_of(snap, p)), "context=state: block without frames")
    free_with_gil(p, 9000)
    # no stacks
    vmmalloc.record_memory_history(10000, 0, stacks=None)
    p = alloc_with_gil(9000)
    snap = vmmalloc.snapshot(device=0)
    check(frames_of(snap, p) == [], "stacks=None: frames %s" % frames_of(snap, p))
    free_with_gil(p, 9000)
    for bad in (dict(stacks="cpp"), dict(context="everything"), dict(enabled="yes")):
        try:
            vmmalloc.record_memory_history(10, 0, **bad)
            check(False, "record_memory_history(%s) accepted" % bad)
        except ValueError:
            pass


def scenario_threads_and_errors():
    vmmalloc.record_memory_history(10000, 0, stacks="all")
    got = {}

    def worker_thread_body():
        got["p"] = alloc_with_gil(11000)
    t = threading.Thread(target=worker_thread_body)
    t.start()
    t.join()
    try:
        raise KeyError("pending")
    except KeyError as e:
        q = alloc_with_gil(12000)  # an exception is being handled meanwhile
        check(isinstance(sys.exc_info()[1], KeyError) and e.args == ("pending",), "exception lost")

    def deep(n):
        if n == 0:
            return alloc_with_gil(13000)
        return deep(n - 1)
    r = deep(150)
    snap = vmmalloc.snapshot(device=0)
    check("worker_thread_body" in names(frames_of(snap, got["p"])), "thread frames: %s" % names(frames_of(snap, got["p"])))
    check("alloc_with_gil" in names(frames_of(snap, q)), "frames during an exception")
    fd = [x for x in frames_of(snap, r) or [] if x["filename"] == THIS]
    check(len(fd) == 96 and fd[0]["name"] == "alloc_with_gil" and fd[1]["name"] == "deep",
          "deep stack: %d Python frames kept: %s" % (len(fd), names(fd)[:4]))
    for p, n in ((got["p"], 11000), (q, 12000), (r, 13000)):
        free_with_gil(p, n)


class Holder:
    """A cycle member whose finalizer frees a vmmalloc block (as a tensor in a cycle does)."""

    def __init__(self, size):
        self.size = size
        self.ptr = GIL.vmm_torch_malloc(size, 0, None)
        self.me = self

    def __del__(self):
        GIL.vmm_torch_free(self.ptr, self.size, 0, None)


def scenario_gc():
    vmmalloc.record_memory_history(10000, 0, stacks="all")
    before = vmmalloc.memory_stats(0)["allocation.all.current"]
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        for _ in range(300):
            Holder(4096)
            p = alloc_with_gil(8192)
            free_with_gil(p, 8192)
    finally:
        gc.set_threshold(*old)
    gc.collect()
    after = vmmalloc.memory_stats(0)["allocation.all.current"]
    check(after == before, "gc scenario: %d blocks live before, %d after" % (before, after))


def bench():
    """ns per malloc + free pair (GIL held, 4 KiB, cached path) for each stacks setting."""
    def pairs(n):
        t = time.perf_counter()
        for _ in range(n):
            p = GIL.vmm_torch_malloc(4096, 0, None)
            GIL.vmm_torch_free(p, 4096, 0, None)
        return (time.perf_counter() - t) / n * 1e9

    def at_depth(d, n):
        return at_depth(d - 1, n) if d else pairs(n)
    res = {}
    for label, kw in (("off", None), ("history", dict(stacks=None)), ("python", dict(stacks="python")),
                      ("native", dict(stacks="native")), ("all", dict(stacks="all"))):
        if kw is None:
            vmmalloc.record_memory_history(0, 0)
        else:
            vmmalloc.record_memory_history(100000, 0, **kw)
        pairs(2000)
        res[label] = min(at_depth(20, 5000) for _ in range(3))
    vmmalloc.record_memory_history(0, 0)
    print("BENCH " + json.dumps({k: round(v) for k, v in res.items()}))


def main():
    vmmalloc.configure(None)
    live = scenario_all()
    scenario_modes(live)
    scenario_threads_and_errors()
    scenario_gc()
    for p, n in live:
        free_with_gil(p, n)
    if "--bench" in sys.argv:
        bench()
    vmmalloc.record_memory_history(0, 0)
    print("snapshot_frames: %s" % ("FAILED (%d)" % len(failures) if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
