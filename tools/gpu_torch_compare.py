#!/usr/bin/env python3
"""PyTorch on a real GPU under three allocators, each in a fresh process (tools/gpu-check, pytorch
phase; docs/gpu.md):

  native       PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  vmmalloc     vmmalloc.torch.install()

1. Training: a randomly initialised decoder built from a transformers LlamaConfig (no download),
   bf16, AdamW, sequence lengths varying per step, the same seed and data in every mode. Reported:
   per-step losses (must be identical across modes: the allocator must not change the numbers),
   peak reserved and allocated, first-step and median step time.
2. Largest batch under one fixed memory cap (--cap-gib, default 16): batches doubled, then bisected,
   one training step each, until the first out-of-memory.
3. PyTorch's sliver scenario (its expandable-segments note): under a cap, N x 256 MiB allocated and
   freed, then N x 192 MiB, then 10 x 128 MiB. Native is expected to run out of memory (the 64 MiB
   slivers of its cached 256 MiB segments cannot serve 128 MiB), expandable segments not.

Exit status: 0 when the losses match and vmmalloc served its run; 1 otherwise; 77 when torch,
transformers or a CUDA device is missing.

    python3 tools/gpu_torch_compare.py [--quick] [--json out.json]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("native", "expandable", "vmmalloc")
SEQ_LENS = (128, 256, 384, 512, 768, 1024)
MiB = 1 << 20


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def setup(mode, cap_bytes):
    """Install the allocator (before CUDA starts) and cap it; returns torch."""
    vt = None
    if mode == "vmmalloc":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import vmmalloc.torch as vt  # noqa: PLC0415
        vt.install()
    import torch  # noqa: PLC0415
    if cap_bytes and mode != "vmmalloc":  # vmmalloc's cap comes from VMMALLOC_CONF (parent)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), 0)
    return torch, vt


def is_oom(torch, vt, e, ooms_before):
    """Whether exception e was an out-of-memory failure. PyTorch's pluggable-allocator path does not
    check a NULL from the allocator (CUDAPluggableAllocator::malloc): the tensor gets no storage and
    the failure surfaces at its first use as "... its data is not allocated yet", or not at all for
    torch.empty; vmmalloc's own OOM counter tells."""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return True
    m = str(e).lower()
    if "out of memory" in m or "not allocated yet" in m:
        return True
    return vt is not None and ooms(vt) > ooms_before


def ooms(vt):
    try:
        return vt.memory_stats(0).get("num_ooms", 0)
    except Exception:  # noqa: BLE001 (a counter that cannot be read counts nothing)
        return 0


def cuda_empty(torch, vt, nbytes):
    """torch.empty on the GPU that raises OutOfMemoryError where the allocator returned NULL (a
    pluggable allocator's failure leaves a tensor without storage, which torch.empty never touches)."""
    before = ooms(vt) if vt is not None else 0
    t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    try:
        null = t.data_ptr() == 0
    except RuntimeError as e:  # "The tensor has a non-zero number of elements, but its data is not allocated yet"
        if "not allocated" not in str(e):
            raise
        null = True
    if null or (vt is not None and ooms(vt) > before):
        raise torch.cuda.OutOfMemoryError("the allocator returned NULL for %d bytes" % nbytes)
    return t


def peaks(torch, vt):
    if vt is not None:
        st = vt.memory_stats(0)
        return st["reserved_bytes.all.peak"], st["allocated_bytes.all.peak"], st.get("num_ooms", 0)
    st = torch.cuda.memory_stats(0)
    return torch.cuda.max_memory_reserved(0), torch.cuda.max_memory_allocated(0), st.get("num_ooms", 0)


def build_model(torch, quick):
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512 if quick else 1024,
                      intermediate_size=1408 if quick else 2816, num_hidden_layers=4 if quick else 8,
                      num_attention_heads=8 if quick else 16, num_key_value_heads=8 if quick else 16,
                      max_position_embeddings=max(SEQ_LENS))
    try:  # plain matmul attention: the same kernels whatever the allocator (the setter varies by version)
        cfg._attn_implementation = "eager"
    except (AttributeError, ValueError):
        pass
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.config.use_cache = False
    return model, cfg


def one_step(torch, model, opt, tokens):
    out = model(input_ids=tokens[:, :-1], labels=tokens[:, :-1])
    opt.zero_grad(set_to_none=True)
    out.loss.backward()
    opt.step()
    return out.loss


def worker_train(mode, steps, batch, quick):
    torch, vt = setup(mode, 0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    model, cfg = build_model(torch, quick)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(99)
    losses, times = [], []
    for _ in range(steps):
        n = SEQ_LENS[int(torch.randint(len(SEQ_LENS), (1,), generator=gen))]
        tokens = torch.randint(cfg.vocab_size, (batch, n + 1), generator=gen).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = one_step(torch, model, opt, tokens)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))
    res, alloc, n_ooms = peaks(torch, vt)
    expandable = None
    if vt is None:  # did the setting take? (a renamed variable would silently leave it native)
        try:
            segs = torch.cuda.memory._snapshot().get("segments", [])  # noqa: SLF001
            expandable = any(sg.get("is_expandable") for sg in segs)
        except Exception:  # noqa: BLE001 (an older snapshot format: unknown)
            pass
    return {"mode": mode, "expandable_segments_seen": expandable, "losses": losses, "first_step_s": times[0],
            "median_step_s": statistics.median(times[1:] or times), "peak_reserved": res,
            "peak_allocated": alloc, "num_ooms": n_ooms, "params": sum(p.numel() for p in model.parameters()),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "installed": vt.is_installed() if vt else None}


def worker_batch(mode, cap_gib, quick):
    torch, vt = setup(mode, cap_gib << 30)
    model, cfg = build_model(torch, quick)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seq = max(SEQ_LENS)

    def fits(b):
        before = ooms(vt) if vt is not None else 0
        try:
            tokens = torch.randint(cfg.vocab_size, (b, seq + 1), device="cuda")
            one_step(torch, model, opt, tokens)
            torch.cuda.synchronize()
            del tokens
            return True
        except RuntimeError as e:  # OutOfMemoryError is one; a pluggable allocator's OOM is another
            if is_oom(torch, vt, e, before):
                if "illegal" in str(e).lower():  # a NULL reached a kernel: the context is gone
                    lost.append(b)
                return False
            raise
        finally:
            opt.zero_grad(set_to_none=True)

    lost = []
    good, bad, b = 0, None, 1
    while b <= 1024 and bad is None:
        if fits(b):
            good, b = b, b * 2
        else:
            bad = b
    tries = 0
    while bad is not None and bad - good > 1 and tries < 4 and not lost:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
        tries += 1
    res, alloc, _ = peaks(torch, vt)
    out = {"mode": mode, "cap_gib": cap_gib, "seq": seq, "largest_batch": good, "first_failing": bad,
           "peak_reserved": res, "peak_allocated": alloc}
    if lost:
        out["note"] = "search stopped: an illegal memory access after the OOM at batch %d" % lost[0]
    return out


def worker_sliver(mode, cap_gib):
    torch, vt = setup(mode, cap_gib << 30)
    n = (cap_gib << 30) // (256 * MiB) - 1  # leave room for PyTorch's own small allocations
    out = {"mode": mode, "cap_gib": cap_gib, "n": n}
    stage = "256"
    before = ooms(vt) if vt is not None else 0
    try:
        xs = [cuda_empty(torch, vt, 256 * MiB) for _ in range(n)]
        del xs
        stage = "192"
        ys = [cuda_empty(torch, vt, 192 * MiB) for _ in range(n)]
        stage = "128"
        zs = [cuda_empty(torch, vt, 128 * MiB) for _ in range(10)]
        del ys, zs
        out["oom"] = None
    except RuntimeError as e:
        if not is_oom(torch, vt, e, before):
            raise
        out["oom"] = "at the %s MiB stage" % stage
    out["peak_reserved"] = peaks(torch, vt)[0]
    return out


def run(args, mode, what, timeout, cap_gib=0):
    env = dict(os.environ)
    # PyTorch reads PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF (deprecated) where that is unset
    for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env.pop(k, None)
        if mode == "expandable":
            env[k] = "expandable_segments:True"
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.setdefault("HF_HUB_OFFLINE", "1")  # no network there: never try the hub
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--what", what,
           "--steps", str(args.steps), "--batch", str(args.batch), "--cap-gib", str(cap_gib)]
    if args.quick:
        cmd.append("--quick")
    if mode == "vmmalloc" and cap_gib:  # the same cap, as vmmalloc's own key
        frac = "per_process_memory_fraction:%.6f" % min(1.0, (cap_gib << 30) / device_total())
        env["VMMALLOC_CONF"] = env["VMMALLOC_CONF"] + "," + frac if env.get("VMMALLOC_CONF") else frac
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "error": "timed out after %.0f s" % timeout}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"mode": mode, "error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-800:])}


_total = None


def device_total():
    """Device 0's memory from the driver (cuDeviceTotalMem): no CUDA context in this process, and
    no second import of torch (seconds) in a child."""
    global _total
    if _total is None:
        import ctypes  # noqa: PLC0415
        cu = ctypes.CDLL("libcuda.so.1")
        dev, total = ctypes.c_int(0), ctypes.c_size_t(0)
        if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0) or \
                cu.cuDeviceTotalMem_v2(ctypes.byref(total), dev) or not total.value:
            raise RuntimeError("cuDeviceTotalMem of device 0 failed")
        _total = total.value
    return _total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller model, fewer steps")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cap-gib", type=int, default=16)
    ap.add_argument("--sliver-cap-gib", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--budget-s", type=float, default=170, help="seconds for everything (runs left out past it)")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--what", choices=("train", "batch", "sliver"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.steps:
        args.steps = 8 if args.quick else 16
    if args.worker:
        if args.what == "train":
            r = worker_train(args.worker, args.steps, args.batch, args.quick)
        elif args.what == "batch":
            r = worker_batch(args.worker, args.cap_gib, args.quick)
        else:
            r = worker_sliver(args.worker, args.cap_gib)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    try:
        import torch  # noqa: PLC0415
        import transformers  # noqa: F401, PLC0415
    except ImportError as e:
        log("skipped: %s" % e)
        return SKIP
    if not torch.cuda.is_available():
        log("skipped: no usable CUDA device")
        return SKIP
    out = {"train": {}, "largest_batch": {}, "sliver": {}}
    end = time.monotonic() + args.budget_s
    for what, key, lim, cap in (("train", "train", 90, 0), ("sliver", "sliver", 45, args.sliver_cap_gib),
                                ("batch", "largest_batch", 90, args.cap_gib)):
        for m in MODES:
            left = end - time.monotonic()
            if left < 10:
                out[key][m] = {"mode": m, "error": "not run: out of the %.0f s budget" % args.budget_s}
                continue
            out[key][m] = run(args, m, what, min(lim, left), cap)

    ok = True
    tr = out["train"]
    for m in MODES:
        if "error" in tr[m]:
            log("FAIL: training under %s: %s" % (m, tr[m]["error"]))
            ok = False
    if ok:
        ref = tr["native"]["losses"]
        for m in MODES[1:]:
            diff = max(abs(a - b) for a, b in zip(ref, tr[m]["losses"]))
            same = len(ref) == len(tr[m]["losses"]) and all(
                math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3) for a, b in zip(ref, tr[m]["losses"]))
            tr[m]["max_loss_diff_vs_native"] = diff
            if not same:
                log("MISMATCH: %s losses differ from native by up to %.3g" % (m, diff))
                ok = False
        for m, want in (("native", False), ("expandable", True)):
            seen = tr[m].get("expandable_segments_seen")
            if seen is not None and seen != want:
                log("FAIL: the %s run %s expandable segments" % (m, "used" if seen else "did not use"))
                ok = False
        if not tr["vmmalloc"].get("installed") or not tr["vmmalloc"].get("peak_allocated"):
            log("FAIL: vmmalloc did not serve its run (installed %s, peak allocated %s)" %
                (tr["vmmalloc"].get("installed"), tr["vmmalloc"].get("peak_allocated")))
            ok = False
    out["losses_match"] = ok
    print("%-10s %10s %12s %12s %10s %10s %8s %14s %s" % ("mode", "params", "peak res", "peak alloc", "first s",
                                                           "median s", "batch", "sliver OOM", "note"))
    for m in MODES:
        t, b, s = tr[m], out["largest_batch"][m], out["sliver"][m]
        print("%-10s %10s %12s %12s %10s %10s %8s %14s %s" % (
            m, t.get("params", "?"), "%.0f MiB" % (t.get("peak_reserved", 0) / MiB),
            "%.0f MiB" % (t.get("peak_allocated", 0) / MiB), "%.3f" % t.get("first_step_s", 0),
            "%.4f" % t.get("median_step_s", 0), b.get("largest_batch", b.get("error", "?")),
            s.get("oom") or ("none" if "oom" in s else s.get("error", "?")), t.get("error", "")))
    print("cap for the batch search %d GiB (seq %d), for the sliver scenario %d GiB" %
          (args.cap_gib, max(SEQ_LENS), args.sliver_cap_gib))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
