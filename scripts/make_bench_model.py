#!/usr/bin/env python3
"""A random-weight Llama checkpoint folder (config.json + model.safetensors) for benchmarks.

Only numpy is needed: the safetensors file is written by hand (8-byte header length, JSON header,
raw little-endian tensors). Usage:
  make_bench_model.py OUT_DIR [--positions 4096] [--layers 4] [--dim 256] [--heads 8] [--kv-heads 4]
                      [--ffn 512] [--vocab 2048] [--seed 0]
The vocabulary size 2048 matches tinystories-656k's tokenizer, which the benchmarks pass with
--tokenizer (random weights: the model answers nothing; memory and time are what is measured).
"""
import argparse
import json
import os
import struct

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--positions", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    D, H, K, d = a.dim, a.heads, a.kv_heads, a.dim // a.heads
    tensors = {"model.embed_tokens.weight": rng.normal(0, 0.02, (a.vocab, D)),
               "model.norm.weight": np.ones(D),
               "lm_head.weight": rng.normal(0, 0.02, (a.vocab, D))}
    for i in range(a.layers):
        pre = f"model.layers.{i}."
        tensors.update({
            pre + "input_layernorm.weight": np.ones(D),
            pre + "post_attention_layernorm.weight": np.ones(D),
            pre + "self_attn.q_proj.weight": rng.normal(0, D ** -0.5, (H * d, D)),
            pre + "self_attn.k_proj.weight": rng.normal(0, D ** -0.5, (K * d, D)),
            pre + "self_attn.v_proj.weight": rng.normal(0, D ** -0.5, (K * d, D)),
            pre + "self_attn.o_proj.weight": rng.normal(0, D ** -0.5, (D, H * d)),
            pre + "mlp.gate_proj.weight": rng.normal(0, D ** -0.5, (a.ffn, D)),
            pre + "mlp.up_proj.weight": rng.normal(0, D ** -0.5, (a.ffn, D)),
            pre + "mlp.down_proj.weight": rng.normal(0, a.ffn ** -0.5, (D, a.ffn)),
        })
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": D,
              "intermediate_size": a.ffn, "num_hidden_layers": a.layers, "num_attention_heads": H,
              "num_key_value_heads": K, "vocab_size": a.vocab, "max_position_embeddings": a.positions,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(a.out)


if __name__ == "__main__":
    main()
