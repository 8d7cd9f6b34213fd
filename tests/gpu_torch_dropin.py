#!/usr/bin/env python3
"""GPU test: vmmalloc as a true drop-in for PyTorch (docs/pytorch.md, "torch.cuda's memory functions").

One process, vmmalloc installed with vmmalloc.torch.install() before anything touches CUDA, then:

  train        a small transformer trained for --steps steps with memory logging as training scripts
               do it: torch.cuda.reset_peak_memory_stats() and max_memory_allocated() every step,
               memory_allocated / memory_reserved / max_memory_reserved, memory_summary() at the end,
               _record_memory_history() during the loop and _dump_snapshot() after it. Every number
               torch.cuda reports must equal vmmalloc's own counters read right after it
               (vmmalloc.torch.memory_stats); the dumped snapshot must hold the trace with this
               file's frames and the live blocks of memory_allocated().
  cap          torch.cuda.set_per_process_memory_fraction(f) with f = (reserved + 1 GiB) / total:
               a tensor 1 GiB larger than the cap leaves must raise torch.OutOfMemoryError (torch.cuda.OutOfMemoryError
               where torch has no OutOfMemoryError) carrying vmmalloc's report, caught as users catch it; num_ooms counts it;
               mem_get_info() keeps the driver's total; a 256 MiB tensor still fits and one more
               training step runs; get_per_process_memory_fraction() reads f back where PyTorch has
               it. Size 0: torch.empty(0) on the device has a null data pointer.
  distributed  torch.distributed with the NCCL backend, world size 1 (a HashStore): all_reduce and
               all_gather on tensors vmmalloc allocated (their storage is a live vmmalloc block).
               Then, where this NCCL has ncclCommRegister (2.19 and later), a communicator of our
               own registers vmmalloc's mappings through the mapping callbacks
               (vmm_set_mapping_callbacks: after_map registers each run mapped, before_unmap
               deregisters it) and runs ncclAllReduce on a registered vmmalloc buffer.

Exit status: 0 pass, 1 a check failed, 77 skipped (no torch, no usable CUDA device; the reason is
printed). --json FILE writes the numbers and each phase's outcome.

    VMMALLOC_LIB=build/libvmmalloc.so python3 tests/gpu_torch_dropin.py --steps 20 --json dropin.json
"""

import argparse
import ctypes
import ctypes.util
import glob
import json
import os
import sys
import tempfile
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
failures = []
report = {"phases": {}}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def check(cond, what):
    if not cond:
        failures.append(what)
        log("FAIL:", what)
    return bool(cond)


def skip(reason):
    print("skipped: %s" % reason)
    sys.exit(SKIP)


def oom_error_class(torch):
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


# ---- phase 1: training with memory logging ---------------------------------------------------

def make_model(torch):
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self, vocab=1000, d=256, layers=4):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, layers)
            self.out = nn.Linear(d, vocab)

        def forward(self, tokens):
            return self.out(self.enc(self.emb(tokens)))

    return Model().cuda()


def train_step(torch, model, opt, gen, seq):
    tokens = torch.randint(0, 1000, (16, seq), device="cuda", generator=gen)
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss)


def same_as_vmmalloc(torch, vt, where):
    """torch.cuda's numbers against vmmalloc's own, read back to back (nothing allocates between)."""
    torch.cuda.synchronize()
    own = vt.memory_stats(0)
    pairs = {
        "memory_allocated": (torch.cuda.memory_allocated(0), own["allocated_bytes.all.current"]),
        "max_memory_allocated": (torch.cuda.max_memory_allocated(0), own["allocated_bytes.all.peak"]),
        "memory_reserved": (torch.cuda.memory_reserved(0), own["reserved_bytes.all.current"]),
        "max_memory_reserved": (torch.cuda.max_memory_reserved(0), own["reserved_bytes.all.peak"]),
    }
    stats = torch.cuda.memory_stats(0)
    for k in ("allocation.all.current", "segment.all.current", "active_bytes.large_pool.peak",
              "inactive_split_bytes.all.current", "num_ooms", "num_alloc_retries"):
        pairs["memory_stats[%s]" % k] = (stats.get(k), own.get(k))
    for name, (t, v) in pairs.items():
        check(t == v, "%s: torch.cuda.%s = %r, vmmalloc's own %r" % (where, name, t, v))
    return {k: t for k, (t, v) in pairs.items()}


def phase_train(torch, vt, vmmalloc, steps, snapshot_path):
    torch.manual_seed(0)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    model = make_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    seqs = (64, 256, 128, 512, 96, 384, 192, 32)
    per_step, losses = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        torch.cuda.reset_peak_memory_stats()
        losses.append(train_step(torch, model, opt, gen, seqs[step % len(seqs)]))
        numbers = same_as_vmmalloc(torch, vt, "step %d" % step)
        per_step.append(numbers["max_memory_allocated"])
        log("step %2d  loss %.4f  max_memory_allocated %.1f MiB  reserved %.1f MiB"
            % (step, losses[-1], numbers["max_memory_allocated"] / 2 ** 20, numbers["memory_reserved"] / 2 ** 20))
    elapsed = time.perf_counter() - t0
    check(all(p > 0 for p in per_step), "max_memory_allocated() > 0 every step")
    check(len(set(per_step)) > 1, "the per-step peaks follow the sequence lengths: %r" % per_step[:8])
    summary = torch.cuda.memory_summary()
    print(summary)
    check("PyTorch CUDA memory summary" in summary and "Allocated memory" in summary, "memory_summary() prints the table")
    torch.cuda.memory._dump_snapshot(snapshot_path)
    torch.cuda.memory._record_memory_history(enabled=None)
    snap = vmmalloc.load_snapshot(snapshot_path)  # plain data only
    trace = snap["device_traces"][0] if snap.get("device_traces") else []
    actions = {e["action"] for e in trace}
    check({"alloc", "free_requested"} <= actions, "the dumped trace has allocs and frees: %r" % sorted(actions))
    frames = [f["filename"] for e in trace if e["action"] == "alloc" for f in e.get("frames", [])]
    if sys.version_info >= (3, 10):  # Python frames need CPython 3.10 (docs/snapshots.md)
        check(any(f.endswith("gpu_torch_dropin.py") for f in frames), "trace frames name this file")
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    check(live == torch.cuda.memory_allocated(0),
          "snapshot live blocks %d = memory_allocated() %d" % (live, torch.cuda.memory_allocated(0)))
    report["phases"]["train"] = {"steps": steps, "losses": losses, "max_memory_allocated_per_step": per_step,
                                 "step_time_s": elapsed / max(steps, 1), "trace_entries": len(trace),
                                 "snapshot": snapshot_path}
    return model, opt, gen


# ---- phase 2: memory cap, out of memory, size 0 -----------------------------------------------

def phase_cap(torch, vt, vmmalloc, model, opt, gen):
    OOM = oom_error_class(torch)
    total = torch.cuda.get_device_properties(0).total_memory
    reserved = torch.cuda.memory_reserved(0)
    fraction = min(1.0, (reserved + (1 << 30)) / total)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        check(abs(torch.cuda.get_per_process_memory_fraction(0) - fraction) < 1e-9, "fraction reads back")
    ooms = torch.cuda.memory_stats(0)["num_ooms"]
    # more than the cap leaves even with every cached byte reused: 1 GiB past it
    request = int(fraction * total) - torch.cuda.memory_allocated(0) + (1 << 30)
    caught, message = None, ""
    try:
        big = torch.empty(request, dtype=torch.uint8, device="cuda")
        del big
    except OOM as e:  # what users write
        caught, message = type(e).__name__, str(e)
    except RuntimeError as e:
        caught, message = "RuntimeError (not OutOfMemoryError)", str(e)
    check(caught == OOM.__name__, "%d MiB (1 GiB past the cap) raises %s: got %r"
          % (request >> 20, OOM.__name__, caught))
    check("CUDA out of memory" in message and "vmmalloc" in message,
          "the error carries vmmalloc's report: %r" % message[:200])
    check("vmmalloc: out of memory" in vt.oom_report(), "vmmalloc.torch.oom_report() has it too")
    check(torch.cuda.memory_stats(0)["num_ooms"] == ooms + 1, "num_ooms counts it")
    free_b, total_b = torch.cuda.mem_get_info(0)
    # the driver's numbers, not the cap's (a cap below 90% of the device shows the difference)
    check(total_b >= 0.99 * total and 0 < free_b <= total_b and (fraction >= 0.9 or total_b > fraction * total),
          "mem_get_info stays the driver's (device total %d, cap %d): %r" % (total, int(fraction * total),
                                                                         (free_b, total_b)))
    ok = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    check(ok.data_ptr() != 0, "256 MiB still fits under the cap")
    del ok
    loss = train_step(torch, model, opt, gen, 128)
    check(loss == loss, "training goes on after the out-of-memory error")
    zero = torch.empty(0, device="cuda")
    check(zero.numel() == 0 and zero.data_ptr() == 0, "size 0: null data pointer, as the native allocator")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    same_as_vmmalloc(torch, vt, "after the cap")
    report["phases"]["cap"] = {"fraction": fraction, "error": caught, "message": message[:500],
                               "mem_get_info": [free_b, total_b]}


# ---- phase 3: torch.distributed NCCL, and NCCL registration of vmmalloc's mappings -----------

def vmm_block_start(vmmalloc, ptr):
    lib = vmmalloc.load()
    lib.vmm_usable_size.restype = ctypes.c_size_t
    lib.vmm_usable_size.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    a = vmmalloc._allocator(0)  # noqa: SLF001
    return lib.vmm_usable_size(a, ctypes.c_void_p(ptr)) > 0


def find_nccl(torch):
    names = ["libnccl.so.2", "libnccl.so"]
    for base in sys.path:
        names += glob.glob(os.path.join(base, "nvidia", "nccl", "lib", "libnccl.so*"))
    found = ctypes.util.find_library("nccl")
    if found:
        names.append(found)
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    return None


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def nccl_registration(torch, vmmalloc):
    """Our own communicator registers every mapped run of vmmalloc's device-0 allocator through the
    mapping callbacks, then all-reduces a vmmalloc buffer with it."""
    out = {"ncclCommRegister": False}
    nccl = find_nccl(torch)
    if nccl is None:
        out["skipped"] = "libnccl not found"
        return out
    if not hasattr(nccl, "ncclCommRegister"):
        out["skipped"] = "this NCCL has no ncclCommRegister (before 2.19)"
        return out
    out["ncclCommRegister"] = True
    lib = vmmalloc.load()
    comm = ctypes.c_void_p()
    uid = NcclUniqueId()
    check(nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0, "ncclGetUniqueId")
    check(nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0, "ncclCommInitRank (world 1)")
    handles, errors = {}, []
    MAPFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                             ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)

    def after_map(ctx, va, size, device, hs, n):
        h = ctypes.c_void_p()
        rc = nccl.ncclCommRegister(comm, ctypes.c_void_p(va), ctypes.c_size_t(size), ctypes.byref(h))
        if rc == 0:
            handles[va] = (size, h)
        else:
            errors.append(("register", va, size, rc))

    def before_unmap(ctx, va, size, device, hs, n):
        got = handles.pop(va, None)
        if got is not None and nccl.ncclCommDeregister(comm, got[1]) != 0:
            errors.append(("deregister", va, size))

    cb_map, cb_unmap = MAPFN(after_map), MAPFN(before_unmap)
    lib.vmm_set_mapping_callbacks.restype = ctypes.c_int
    lib.vmm_set_mapping_callbacks.argtypes = [ctypes.c_void_p, MAPFN, MAPFN, ctypes.c_void_p]
    a = vmmalloc._allocator(0)  # noqa: SLF001
    rc = lib.vmm_set_mapping_callbacks(a, cb_map, cb_unmap, None)
    check(rc == 0, "vmm_set_mapping_callbacks: %d %s" % (rc, vmmalloc.last_error()))
    x = torch.full((1 << 22,), 2.0, device="cuda")  # 16 MiB, in a registered run (mapped now or before)
    stream = torch.cuda.current_stream().cuda_stream
    rc = nccl.ncclAllReduce(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(x.data_ptr()),
                            ctypes.c_size_t(x.numel()), 7, 0, comm, ctypes.c_void_p(stream))  # float32, sum
    torch.cuda.synchronize()
    check(rc == 0 and bool((x == 2.0).all()), "ncclAllReduce on a registered vmmalloc buffer (world 1)")
    out["registered_runs"] = len(handles)
    out["registered_bytes"] = sum(s for s, _ in handles.values())
    check(out["registered_runs"] > 0, "vmmalloc's mappings were registered with NCCL")
    check(not errors, "ncclCommRegister / Deregister errors: %r" % errors[:4])
    del x
    null = ctypes.cast(None, MAPFN)
    check(lib.vmm_set_mapping_callbacks(a, null, null, None) == 0, "callbacks removed")
    for va, (size, h) in list(handles.items()):
        nccl.ncclCommDeregister(comm, h)
    nccl.ncclCommDestroy(comm)
    return out


def phase_distributed(torch, vmmalloc):
    import torch.distributed as dist  # noqa: PLC0415
    if not dist.is_available() or not dist.is_nccl_available():
        report["phases"]["distributed"] = {"skipped": "torch.distributed or NCCL not available"}
        log("distributed: skipped (no NCCL in this torch)")
        return
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        check(vmm_block_start(vmmalloc, x.untyped_storage().data_ptr()), "the tensor is a vmmalloc block")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        check(bool((x == torch.arange(1 << 20, dtype=torch.float32, device="cuda")).all()),
              "all_reduce (world 1) leaves the values")
        out = [torch.empty_like(x)]
        dist.all_gather(out, x)
        torch.cuda.synchronize()
        check(bool((out[0] == x).all()) and vmm_block_start(vmmalloc, out[0].untyped_storage().data_ptr()),
              "all_gather into a vmmalloc tensor")
        dist.barrier()
        info = {"backend": dist.get_backend(), "nccl_version": list(torch.cuda.nccl.version())
                if hasattr(torch.cuda, "nccl") else None}
    finally:
        dist.destroy_process_group()
    info.update(nccl_registration(torch, vmmalloc))
    report["phases"]["distributed"] = info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--snapshot", default=None, help="where _dump_snapshot writes (default: a temp file)")
    args = ap.parse_args()
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        skip("PyTorch is not installed (%s)" % e)
    if not torch.cuda.is_available():  # counts devices; does not initialize CUDA
        skip("torch.cuda.is_available() is False (PyTorch %s, CUDA %s)" % (torch.__version__, torch.version.cuda))
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import vmmalloc  # noqa: PLC0415
    import vmmalloc.torch as vt  # noqa: PLC0415
    path = vt.install()
    st = vt.status()
    log("vmmalloc %s installed from %s; PyTorch %s; status %r" % (vmmalloc.__version__, path, torch.__version__, st))
    report.update(torch=torch.__version__, cuda=torch.version.cuda, library=path,
                  status={k: v for k, v in st.items() if k != "graphs"})
    check(st["oom"] == "c10", "out of memory raises torch.OutOfMemoryError (shim built against torch): %r"
          % st["oom"])
    check(not st["memory_api"]["missing"], "every torch._C memory entry point found: %r" % st["memory_api"])
    snapshot_path = args.snapshot or os.path.join(tempfile.mkdtemp(prefix="vmmalloc-dropin-"), "snapshot.pickle")
    report["device"] = torch.cuda.get_device_name(0)
    model, opt, gen = phase_train(torch, vt, vmmalloc, args.steps, snapshot_path)
    phase_cap(torch, vt, vmmalloc, model, opt, gen)
    del model, opt
    phase_distributed(torch, vmmalloc)
    report["failures"] = failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("gpu_torch_dropin: %s (%d failure(s)); device %s, PyTorch %s"
          % ("PASS" if not failures else "FAIL", len(failures), report["device"], torch.__version__))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
