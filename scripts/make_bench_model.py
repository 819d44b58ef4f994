"""Writes a random-weight Llama checkpoint at a realistic shape for benchmarks (no downloads).

Usage: make_bench_model.py OUT_DIR [--layers 12 --heads 12 --kv-heads 12 --d-model 768 --d-ff 2048
                                    --vocab 50257 --ctx 4096 --seed 0 --dtype float32 --untied]
Defaults: the GPT-2-small shape as a Llama (12 x 12 heads, d_model 768, MLP 2048, vocab 50257,
4096 positions), tied embeddings, float32 (~0.5 GB). Weights ~ N(0, 0.02^2), norms 1. Needs numpy.
--dtype bfloat16 stores every tensor as BF16 (float32 rounded to nearest even: half the bytes, as
real checkpoints ship); --untied adds lm_head.weight (Llama-2's layout; Llama-3.2-1B ties them).
Real shapes (scripts/bench_real_sizes.sh): Llama-3.2-1B --layers 16 --d-model 2048 --heads 32
--kv-heads 8 --d-ff 8192; Llama-2-7B --layers 32 --d-model 4096 --heads 32 --d-ff 11008 --untied.
"""
import argparse, json, os, struct

import numpy as np


def to_bf16(arr):
    """float32 -> bfloat16 bits (little-endian uint16), rounded to nearest even as torch rounds."""
    u = np.ascontiguousarray(arr, np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--d-ff", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--untied", action="store_true", help="a separate lm_head.weight (tie_word_embeddings false)")
    a = ap.parse_args()
    K = a.kv_heads or a.heads
    D, H, F, V = a.d_model, a.heads, a.d_ff, a.vocab
    d = D // H
    if d * H != D or H % K:
        raise SystemExit(f"make_bench_model.py: d_model {D} must be heads x head_dim and heads {H} a multiple of kv heads {K}")
    rng = np.random.default_rng(a.seed)
    shapes = [("model.embed_tokens.weight", (V, D), "w")]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        shapes += [(p + "input_layernorm.weight", (D,), "one"),
                   (p + "self_attn.q_proj.weight", (H * d, D), "w"),
                   (p + "self_attn.k_proj.weight", (K * d, D), "w"),
                   (p + "self_attn.v_proj.weight", (K * d, D), "w"),
                   (p + "self_attn.o_proj.weight", (D, H * d), "w"),
                   (p + "post_attention_layernorm.weight", (D,), "one"),
                   (p + "mlp.gate_proj.weight", (F, D), "w"),
                   (p + "mlp.up_proj.weight", (F, D), "w"),
                   (p + "mlp.down_proj.weight", (D, F), "w")]
    shapes.append(("model.norm.weight", (D,), "one"))
    if a.untied:
        shapes.append(("lm_head.weight", (V, D), "w"))
    bf16 = a.dtype == "bfloat16"
    size = 2 if bf16 else 4
    header, off = {}, 0
    for name, shape, _ in shapes:
        n = int(np.prod(shape)) * size
        header[name] = {"dtype": "BF16" if bf16 else "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    os.makedirs(a.out, exist_ok=True)
    tmp = os.path.join(a.out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape, kind in shapes:
            arr = np.ones(shape, np.float32) if kind == "one" else (rng.standard_normal(shape, np.float32) * 0.02)
            f.write(to_bf16(arr).tobytes() if bf16 else arr.astype("<f4").tobytes())
    os.replace(tmp, os.path.join(a.out, "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
           "intermediate_size": F, "num_hidden_layers": a.layers, "num_attention_heads": H,
           "num_key_value_heads": K, "vocab_size": V, "max_position_embeddings": a.ctx,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": not a.untied, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": a.dtype}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(os.path.join(a.out))


if __name__ == "__main__":
    main()
