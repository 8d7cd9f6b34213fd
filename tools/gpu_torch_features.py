#!/usr/bin/env python3
"""What only vmmalloc does, under PyTorch on a real GPU (tools/gpu-check, features phase):

1. A snapshot pickle of a vmmalloc-run training step (first: a capture that fails may leave the
   stream capturing, which would fail what follows it) (vmmalloc.torch.record_memory_history +
   snapshot): written to --snapshot, read back with pickle, segments and a trace present.
2. CUDA graph capture with vmmalloc's private pools: a small MLP's forward + backward captured with
   torch.cuda.graph after a warm-up on a side stream, replayed 3 times on new inputs; each replay's
   loss must equal the eager loss on the same input and weights, and vmmalloc's private pools
   (vmmalloc.graphs.status(), memory stats) must have held the graph's memory.

Exit 0 when both pass, 1 when one fails, 77 without torch or a CUDA device.

    python3 tools/gpu_torch_features.py [--snapshot out.pickle] [--json out.json]
"""

import argparse
import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SKIP = 77


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snapshot", default="snapshot.pickle")
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        log("skipped: %s" % e)
        return SKIP
    if not torch.cuda.is_available():
        log("skipped: no usable CUDA device")
        return SKIP
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import vmmalloc.graphs as vg  # noqa: PLC0415
    import vmmalloc.torch as vt  # noqa: PLC0415
    vt.install()
    out = {"graphs_status": str(vg.status())}
    ok = True

    # ---- 1. snapshot of a training step (first: a capture that fails can leave the stream capturing) ----
    try:
        vt.record_memory_history(10000)
        m2 = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()
        opt = torch.optim.AdamW(m2.parameters())
        for _ in range(2):
            loss = m2(torch.randn(128, 2048, device="cuda")).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        vt.snapshot(a.snapshot)
        vt.record_memory_history(None)
        del m2, opt, loss
        with open(a.snapshot, "rb") as f:
            snap = pickle.load(f)
        segs = snap.get("segments", [])
        traces = snap.get("device_traces", [[]])
        out["snapshot"] = {"bytes": os.path.getsize(a.snapshot), "segments": len(segs),
                           "trace_entries": len(traces[0]) if traces else 0}
        if not segs or not out["snapshot"]["trace_entries"]:
            log("FAIL: snapshot has %d segments and %d trace entries" % (len(segs), out["snapshot"]["trace_entries"]))
            ok = False
    except Exception as e:
        out["snapshot"] = "failed: %s: %s" % (type(e).__name__, e)
        log("FAIL: snapshot: %s" % out["snapshot"])
        ok = False

    # ---- 2. capture and replay ----
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        static_x = torch.randn(64, 1024, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model.zero_grad(set_to_none=True)
                model(static_x).square().mean().backward()
        torch.cuda.current_stream().wait_stream(s)
        model.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = model(static_x).square().mean()
            static_loss.backward()
        st = vt.memory_stats(0)
        out["after_capture"] = {k: v for k, v in st.items() if "private" in k or k.startswith("reserved_bytes.all")}
        # the capture's tensors (loss, grads) live on in its private pool
        if not vg.status().get("hooks") or st.get("private_pools.count", 0) < 1 or \
                st.get("private_pools.allocated_bytes", 0) <= 0:
            log("FAIL: the capture's memory is not in a vmmalloc private pool (hooks %s, %s)" %
                (vg.status().get("hooks"), out["after_capture"]))
            ok = False
        diffs = []
        for i in range(3):
            x = torch.randn(64, 1024, device="cuda")
            static_x.copy_(x)
            g.replay()
            torch.cuda.synchronize()
            with torch.no_grad():
                eager = model(x).square().mean()
            diffs.append(abs(float(static_loss) - float(eager)))
        out["replay_loss_diffs"] = diffs
        if max(diffs) > 1e-4:
            log("FAIL: graph replays differ from eager by up to %g" % max(diffs))
            ok = False
        del g, static_loss
        torch.cuda.synchronize()
        out["capture"] = "passed" if ok else "failed"
    except Exception as e:  # the report wants the reason, whatever it is
        out["capture"] = "failed: %s: %s" % (type(e).__name__, e)
        log("FAIL: capture: %s" % out["capture"])
        ok = False

    print(json.dumps(out, indent=1, default=str))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
