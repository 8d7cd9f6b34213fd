#!/usr/bin/env python3
"""Write a synthetic trace CSV (action,addr,size,stream,time_us) of a training run whose sequence
length changes every step, the shape of a decoder-only Transformer LM trained with AdamW on
variable-length batches: weights live throughout; per step the forward pass allocates each layer's
activations (those autograd saves stay until the backward pass reaches the layer, the others are
freed at once: attention scores before their softmax, projections after their residual add), the
backward pass frees them in reverse beside short-lived activation gradients and allocates the
weight gradients, the first step allocates AdamW's two states per weight, and zero_grad(set_to_none)
frees the gradients. Activation sizes scale with the step's sequence length (attention's with its
square), so every step asks for sizes the earlier ones did not. For `vmm-bench replay`
(docs/benchmarks.md, "Handle sizes").

usage: gen_varlen_trace.py [--steps N] [--layers N] [--d-model N] [--heads N] [--batch N]
                           [--vocab N] [--min-seq N] [--max-seq N] [--bf16] [--seed N] [-o OUT.csv]
"""

import argparse
import random
import sys

from synthetic_trace import TraceWriter


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--min-seq", type=int, default=128)
    ap.add_argument("--max-seq", type=int, default=1024)
    ap.add_argument("--bf16", action="store_true",
                    help="activations in bf16 under autocast, with bf16 copies of the weights per step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-o", "--output")
    a = ap.parse_args(argv)
    if not 0 < a.min_seq <= a.max_seq:
        ap.error("need 0 < --min-seq <= --max-seq")
    rnd = random.Random(a.seed)
    out = open(a.output, "w") if a.output else sys.stdout
    trace = TraceWriter(out)
    alloc, free = (lambda size: trace.alloc(size, 0)), trace.free

    D, H, B, V, FF = a.d_model, a.heads, a.batch, a.vocab, 4 * a.d_model
    e = 2 if a.bf16 else 4  # bytes per activation element
    # weights (fp32): per layer two layer norms, qkv, output projection, the MLP's two matrices
    layer_shapes = [(D,), (D,), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,), (FF, D), (FF,), (D, FF), (D,)]
    shapes = [(V, D)] + layer_shapes * a.layers + [(D,), (D,), (V, D)]

    def numel(shape):
        n = 1
        for x in shape:
            n *= x
        return n

    weights = [alloc(4 * numel(s)) for s in shapes]
    opt_state = []
    for step in range(a.steps):
        S = rnd.randrange(a.min_seq, a.max_seq + 1, 64) if a.max_seq - a.min_seq >= 64 else a.min_seq
        BS = B * S
        casts = [alloc(2 * numel(s)) for s in shapes if len(s) == 2] if a.bf16 else []
        saved = [alloc(8 * BS), alloc(e * BS * D)]  # token ids, embedding output
        layers = []
        for _ in range(a.layers):
            keep = [alloc(e * BS * D), alloc(4 * BS), alloc(4 * BS)]  # ln1 out, mean, rstd
            keep.append(alloc(e * 3 * BS * D))  # qkv
            scores = alloc(e * B * H * S * S)
            keep.append(alloc(e * B * H * S * S))  # softmax out
            free(scores)
            keep.append(alloc(e * BS * D))  # attention out
            proj = alloc(e * BS * D)
            keep.append(alloc(e * BS * D))  # residual
            free(proj)
            keep += [alloc(e * BS * D), alloc(4 * BS), alloc(4 * BS)]  # ln2 out, mean, rstd
            keep += [alloc(e * BS * FF), alloc(e * BS * FF)]  # fc1 out, gelu out
            f2 = alloc(e * BS * D)
            keep.append(alloc(e * BS * D))  # residual
            free(f2)
            layers.append(keep)
        head = [alloc(e * BS * D), alloc(4 * BS), alloc(4 * BS), alloc(e * BS * V)]  # ln_f, logits
        logp = alloc(4 * BS * V)  # cross-entropy's log-softmax, fp32
        loss = alloc(4)
        # backward: the loss's gradient, then the head, then the layers in reverse
        g_logits = alloc(e * BS * V)
        free(logp)
        grads = {}
        grads[len(shapes) - 1] = alloc(4 * numel(shapes[-1]))
        dx = alloc(e * BS * D)
        free(g_logits)
        for t in head:
            free(t)
        grads[len(shapes) - 3] = alloc(4 * D)
        grads[len(shapes) - 2] = alloc(4 * D)
        for li in range(a.layers - 1, -1, -1):
            keep = layers[li]
            base = 1 + li * len(layer_shapes)

            def wgrad(*ws):  # the layer's weight gradients, in the order backward makes them
                for w in ws:
                    grads[base + w] = alloc(4 * numel(layer_shapes[w]))

            g_h = alloc(e * BS * FF)  # through fc2, gelu, fc1
            wgrad(10, 11)
            g_h2 = alloc(e * BS * FF)
            free(g_h)
            wgrad(8, 9)
            ndx = alloc(e * BS * D)
            free(g_h2)
            wgrad(6, 7)
            free(dx)
            dx = ndx
            g_o = alloc(e * BS * D)  # through the output projection
            wgrad(4, 5)
            g_p = alloc(e * B * H * S * S)  # attention: softmax and scores' gradients
            g_s = alloc(e * B * H * S * S)
            free(g_p)
            g_qkv = alloc(e * 3 * BS * D)
            free(g_s)
            free(g_o)
            wgrad(2, 3)
            ndx = alloc(e * BS * D)
            free(g_qkv)
            wgrad(0, 1)
            free(dx)
            dx = ndx
            for t in reversed(keep):
                free(t)
        grads[0] = alloc(4 * numel(shapes[0]))
        free(dx)
        for t in reversed(saved):
            free(t)
        free(loss)
        for c in casts:
            free(c)
        if step == 0:  # AdamW's exp_avg and exp_avg_sq, on the first step
            for s in shapes:
                opt_state += [alloc(4 * numel(s)), alloc(4 * numel(s))]
        for i in sorted(grads):  # zero_grad(set_to_none=True)
            free(grads[i])
    for b in opt_state + weights:
        free(b)
    if a.output:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
