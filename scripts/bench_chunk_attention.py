#!/usr/bin/env python3
"""A prefill chunk's attention on the CPU: libtorch's masked flash call against headscope's two calls
(src/model/torch_compat.cpp `chunk_attention`: the cached keys unmasked with a kv head's query heads
stacked along the queries, the diagonal block causal, merged by log-sum-exp), and the whole prompt in one
causal call (what a full-prompt prefill runs). Seconds per layer over a prompt prefilled in chunks.

    .venv-peers/bin/python scripts/bench_chunk_attention.py [--heads 32] [--kv-heads 8] [--tokens 8192]
        [--chunk 512] [--threads 2]

Needs PyTorch >= 2.5 (its CPU flash kernel's log-sum-exp, `enable_gqa`): .venv-peers or .venv-torch2
(scripts/setup_peers.sh). docs/performance.md, "GQA's chunks without a mask".
"""
import argparse
import sys
import time

try:
    import torch
except ImportError:
    sys.exit("bench_chunk_attention.py: this Python has no torch; run it with .venv-peers/bin/python (scripts/setup_peers.sh)")
if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    sys.exit(f"bench_chunk_attention.py: torch {torch.__version__} has no CPU flash log-sum-exp (needs >= 2.5)")

ap = argparse.ArgumentParser()
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv-heads", type=int, default=8)
ap.add_argument("--d-head", type=int, default=64)
ap.add_argument("--tokens", type=int, default=8192)
ap.add_argument("--chunk", type=int, default=512)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()
torch.set_num_threads(a.threads)
F = torch.nn.functional
fa = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
H, K, d, T, C = a.heads, a.kv_heads, a.d_head, a.tokens, a.chunk
g = H // K
torch.manual_seed(0)
q, k, v = torch.randn(1, H, T, d), torch.randn(1, K, T, d), torch.randn(1, K, T, d)


def timed(f):
    f()
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def masked(p0, S):
    m = torch.arange(S)[None, :] <= torch.arange(p0, S)[:, None]
    return lambda: F.scaled_dot_product_attention(q[:, :, p0:S], k[:, :, :S], v[:, :, :S], attn_mask=m, enable_gqa=True)


def two_calls(p0, S):
    def f():
        qc, n = q[:, :, p0:S], S - p0
        kd, vd = k[:, :, p0:S].repeat_interleave(g, 1), v[:, :, p0:S].repeat_interleave(g, 1)
        o2, l2 = fa(qc, kd, vd, 0.0, True)
        if p0 == 0:
            return o2
        o1, l1 = fa(qc.reshape(1, K, g * n, d), k[:, :, :p0], v[:, :, :p0], 0.0, False)
        l1, l2 = l1.reshape(1, H, n, 1), l2.reshape(1, H, n, 1)
        top = torch.maximum(l1, l2)
        w1, w2 = (l1 - top).exp(), (l2 - top).exp()
        return o1.reshape(1, H, n, d) * (w1 / (w1 + w2)) + o2 * (w2 / (w1 + w2))
    return f


worst = 0.0
tm = tt = 0.0
for p0 in range(0, T, C):
    S = min(T, p0 + C)
    fm, ft = masked(p0, S), two_calls(p0, S)
    tm += timed(fm)
    tt += timed(ft)
    worst = max(worst, (fm() - ft()).abs().max().item())
whole = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
print(f"torch {torch.__version__}, {a.threads} threads; {H} query / {K} kv heads, d {d}, {T} tokens in chunks of {C}")
print(f"masked call a chunk: {tm:.3f} s a layer")
print(f"two calls a chunk:   {tt:.3f} s a layer ({tm / tt:.2f}x; largest difference {worst:.1e})")
print(f"whole prompt, one causal call: {whole:.3f} s a layer")
