#!/usr/bin/env python3
"""GPU test: a small transformer trained for N steps with varying sequence lengths, three times in
fresh processes with the same seed and data:

  native       PyTorch's caching allocator, default settings
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  vmmalloc     vmmalloc installed with vmmalloc.torch.install() (VMMALLOC_CONF applies)

The per-step losses must match across the three (numpy-free allclose); peak reserved, peak
allocated and the mean step time of each run are printed (and written as JSON with --json). The
vmmalloc run must also have been served by vmmalloc: its worker reads vmmalloc's own counters
(vmmalloc.torch.memory_stats), and a peak of 0 allocated bytes there means PyTorch allocated
elsewhere (an install that did nothing), which fails the test.

Exit status: 0 pass, 1 mismatch, a failed run or a vmmalloc run that vmmalloc did not serve, 77
skipped (no torch, or no usable CUDA device).

    python3 tests/gpu_torch_train.py [--steps 60] [--json out.json]
    VMMALLOC_LIB=build/libvmmalloc.so python3 tests/gpu_torch_train.py

ctest runs it through tests/python/test_pytorch_gpu.c (label gpu).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("native", "expandable", "vmmalloc")
# Sequence lengths visited in a fixed pseudo-random order: varying shapes are what fragments a
# caching allocator (the blocks of one step do not fit the holes left by the previous one).
SEQ_LENS = (32, 64, 96, 128, 192, 256, 384, 512)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- worker: one training run ---------------------------------------------------------------


def worker(mode, steps, seed):
    if mode == "vmmalloc":
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import vmmalloc.torch as vt
        path = vt.install()  # before anything touches CUDA
        log("vmmalloc installed from", path)
    import torch
    import torch.nn as nn

    # Determinism: the same kernels and reductions in every run, whatever the allocator.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_math_sdp(True)
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not fail, where none exists

    vocab, d_model, n_layers, n_heads, batch = 2048, 256, 4, 4, 16

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d_model)
            self.pos = nn.Embedding(max(SEQ_LENS), d_model)
            layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=4 * d_model,
                                               dropout=0.0, batch_first=True, norm_first=True)
            self.body = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, tokens):
            n = tokens.shape[1]
            pos = torch.arange(n, device=tokens.device)
            mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
            h = self.emb(tokens) + self.pos(pos)[None]
            return self.head(self.body(h, mask=mask))

    torch.manual_seed(seed)
    model = Model().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data_gen = torch.Generator().manual_seed(seed + 1)  # CPU generator: same batches in every run
    losses, times = [], []
    for step in range(steps):
        n = SEQ_LENS[int(torch.randint(len(SEQ_LENS), (1,), generator=data_gen))]
        tokens = torch.randint(vocab, (batch, n + 1), generator=data_gen).cuda(non_blocking=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.item()))

    warm = times[min(5, len(times) - 1):]
    out = {"mode": mode, "losses": losses, "step_time_s": sum(warm) / len(warm),
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    if mode == "vmmalloc":
        st = vt.memory_stats(0)  # vmmalloc's own counters, not PyTorch's
        out.update(peak_reserved=st["reserved_bytes.all.peak"],
                   peak_allocated=st["allocated_bytes.all.peak"],
                   num_ooms=st["num_ooms"], num_event_waits=st.get("num_event_waits"),
                   num_sync_all_streams=st["num_sync_all_streams"],
                   num_allocations=st["allocation.all.allocated"], installed=vt.is_installed())
    else:
        out.update(peak_reserved=torch.cuda.max_memory_reserved(0),
                   peak_allocated=torch.cuda.max_memory_allocated(0),
                   num_ooms=torch.cuda.memory_stats(0).get("num_ooms", 0))
    print("RESULT " + json.dumps(out), flush=True)


# ---- driver: three runs, compare ------------------------------------------------------------


def allclose(a, b, rtol=1e-4, atol=1e-5):
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rtol, abs_tol=atol) for x, y in zip(a, b))


def vmmalloc_unserved(result):
    """Why the vmmalloc run's result shows that vmmalloc did not serve its allocations, or None
    when it did: vmmalloc.torch must report itself installed, and vmmalloc's own counters for
    device 0 must have seen allocations (peak allocated bytes > 0)."""
    if result.get("installed") is False:
        return "vmmalloc.torch.is_installed() is False in the vmmalloc run"
    peak = result.get("peak_allocated") or 0
    if peak <= 0:
        return ("vmmalloc's own peak allocated bytes (allocated_bytes.all.peak of "
                "vmmalloc.torch.memory_stats(0)) is %r after the vmmalloc run: PyTorch did not "
                "allocate through vmmalloc (install() had no effect?)" % peak)
    return None


def run_mode(mode, steps, seed, timeout):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # needed by use_deterministic_algorithms
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--steps", str(steps),
           "--seed", str(seed)]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    log("run %s failed (exit %d):\n%s" % (mode, p.returncode, p.stderr[-4000:]))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", help="write the three results here")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.seed)
        return 0

    try:
        import torch
    except ImportError as e:
        log("skipped: PyTorch is not installed (%s)" % e)
        return SKIP
    if not torch.cuda.is_available():  # does not initialise CUDA in this (parent) process
        log("skipped: no usable CUDA device")
        return SKIP

    results = {}
    for mode in MODES:
        r = run_mode(mode, args.steps, args.seed, args.timeout)
        if r is None:
            return 1
        results[mode] = r

    unserved = vmmalloc_unserved(results["vmmalloc"])
    if unserved:
        log("FAIL: " + unserved)
    losses_match = True
    ref = results["native"]["losses"]
    for mode in MODES[1:]:
        same = allclose(ref, results[mode]["losses"])
        if not same:
            worst = max(abs(x - y) for x, y in zip(ref, results[mode]["losses"]))
            log("MISMATCH: %s losses differ from native (max abs diff %.3g)" % (mode, worst))
        losses_match &= same
    ok = losses_match and not unserved
    mib = float(1 << 20)
    print("device: %s, torch %s, %d steps, seq lens %s" % (results["native"]["device"],
          results["native"]["torch"], args.steps, list(SEQ_LENS)))
    print("%-11s %14s %15s %9s %13s %s" % ("allocator", "peak reserved", "peak allocated", "ratio",
                                           "step time", "final loss"))
    for mode in MODES:
        r = results[mode]
        print("%-11s %10.1f MiB %11.1f MiB %9.3f %10.2f ms %.6f" % (
            mode, r["peak_reserved"] / mib, r["peak_allocated"] / mib,
            r["peak_reserved"] / max(r["peak_allocated"], 1), r["step_time_s"] * 1e3, r["losses"][-1]))
    print("losses match: %s" % ("yes" if losses_match else "NO"))
    print("vmmalloc served the vmmalloc run: %s" % ("NO" if unserved else "yes (%d allocations)"
                                                     % results["vmmalloc"].get("num_allocations", 0)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"losses_match": losses_match, "vmmalloc_served": not unserved,
                       "runs": results}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
