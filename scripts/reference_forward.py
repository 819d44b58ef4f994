#!/usr/bin/env python3
"""Tiny random checkpoints and independent float64 reference forwards for headscope's families.

    scripts/reference_forward.py --out tests/fixtures/families

For each configuration below it writes <out>/<name>/ with
  config.json            a Hugging Face config naming the architecture
  model.safetensors      random weights under the checkpoint's real tensor names and layouts
                         (GPT-2 Conv1D [in, out], GPT-NeoX per-head interleaved query_key_value,
                         q/k rows in the rotate_half layout as HF checkpoints store them),
                         stored as F16 to keep the fixtures small
  reference.safetensors  tokens int64 [T], logits float32 [T, V], patterns float32 [L, H, T, T]

The forwards below are written from transformers' modeling files (v4.50.0 unless noted:
models/gpt2/modeling_gpt2.py, gpt_neox/modeling_gpt_neox.py, gemma/modeling_gemma.py,
gemma2/modeling_gemma2.py, gemma3/modeling_gemma3.py, olmo2/modeling_olmo2.py,
qwen3/modeling_qwen3.py, llama/modeling_llama.py, mistral/modeling_mistral.py,
qwen2/modeling_qwen2.py, and modeling_rope_utils.py for the llama3 and linear RoPE scalings),
in plain torch and float64, sharing nothing with the C++ code. Where `transformers` is importable
the script also loads each folder with it (eager attention, float64) and compares logits.

The script needs a Python with torch (Debian's /usr/bin/python3 has it); it re-executes itself
with /usr/bin/python3 when the current interpreter lacks torch.
"""
import argparse
import json
import math
import os
import struct
import sys
import zlib


def _ensure_torch():
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    alt = "/usr/bin/python3"
    if os.path.realpath(sys.executable) != os.path.realpath(alt) and os.path.exists(alt) \
            and not os.environ.get("HS_REEXEC"):
        os.environ["HS_REEXEC"] = "1"
        os.execv(alt, [alt] + sys.argv)
    sys.exit("reference_forward.py: no Python with torch found (tried %s and %s); "
             "install python3-torch or run with a Python that has torch" % (sys.executable, alt))


_ensure_torch()
import torch  # noqa: E402

T_SEQ = 24
VOCAB = 97
F64 = torch.float64

# ---------------------------------------------------------------- safetensors writer

_DT = {torch.float16: "F16", torch.float32: "F32", torch.float64: "F64", torch.int64: "I64",
       torch.int32: "I32", torch.bfloat16: "BF16"}


def write_safetensors(path, tensors):
    """The safetensors format: u64 little-endian header length, JSON header, raw row-major data."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- shared reference pieces

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x, w, eps):          # LlamaRMSNorm / Qwen3RMSNorm / Olmo2RMSNorm
    return w * rms(x, eps)


def gemma_norm(x, w, eps):        # GemmaRMSNorm: x * (1 + w)
    return rms(x, eps) * (1.0 + w)


def gelu_tanh(x):                 # gelu_new / gelu_pytorch_tanh
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_exact(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def silu(x):
    return x * torch.sigmoid(x)


def inv_freq(dim, base, scaling=None):
    f = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=F64) / dim))
    if not scaling:
        return f
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":          # modeling_rope_utils._compute_linear_scaling_rope_parameters
        return f / scaling["factor"]
    if kind == "llama3":          # modeling_rope_utils._compute_llama3_parameters
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        out = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = ~(wl < high_wl) * ~(wl > low_wl)
        return torch.where(medium, smoothed, out)
    raise ValueError(kind)


def rope(x, f):
    """rotate_half RoPE on the first 2*len(f) dims of x [H, T, d] (apply_rotary_pos_emb)."""
    rot = 2 * f.numel()
    ang = torch.outer(torch.arange(x.shape[-2], dtype=F64), f)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos(), emb.sin()
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


def attend(q, k, v, scale, window=0, softcap=0.0):
    """q [H, T, d], k/v [K, T, d] -> z [T, H*d], pattern [H, T, T] (eager_attention_forward)."""
    H, T, d = q.shape
    g = H // k.shape[0]
    k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)   # repeat_kv
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    vis = j <= i
    if window:
        vis = vis & (j > i - window)   # sliding_window_overlay: kv_idx > q_idx - window
    s = s.masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, -1)
    return (p @ v).transpose(0, 1).reshape(T, H * d), p


def heads(x, n, d):               # [T, n*d] -> [n, T, d]
    return x.view(x.shape[0], n, d).transpose(0, 1)


def lin(x, sd, name, bias=False):
    y = x @ sd[name + ".weight"].t()
    return y + sd[name + ".bias"] if bias else y


# ---------------------------------------------------------------- forwards

def forward_llama(c, sd, tok):
    """modeling_llama.py / modeling_mistral.py / modeling_qwen2.py / modeling_qwen3.py."""
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    d = c.get("head_dim") or c["hidden_size"] // H
    eps, qkb = c["rms_norm_eps"], c.get("attention_bias", False)
    arch = c["architectures"][0]
    qkb = qkb or arch == "Qwen2ForCausalLM"
    ob = c.get("attention_bias", False) and arch != "Qwen2ForCausalLM"
    f = inv_freq(d, c.get("rope_theta", 10000.0), c.get("rope_scaling"))
    window = (c.get("sliding_window") or 0) if arch == "MistralForCausalLM" else 0
    x = sd["model.embed_tokens.weight"][tok]
    pats = []
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, sd[p + "input_layernorm.weight"], eps)
        q = heads(lin(h, sd, p + "self_attn.q_proj", qkb), H, d)
        k = heads(lin(h, sd, p + "self_attn.k_proj", qkb), K, d)
        v = heads(lin(h, sd, p + "self_attn.v_proj", qkb), K, d)
        if arch == "Qwen3ForCausalLM":   # Qwen3Attention: q_norm/k_norm over head_dim before RoPE
            q = rms_norm(q, sd[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, sd[p + "self_attn.k_norm.weight"], eps)
        z, pat = attend(rope(q, f), rope(k, f), v, d ** -0.5, window)
        pats.append(pat)
        x = x + lin(z, sd, p + "self_attn.o_proj", ob)
        h = rms_norm(x, sd[p + "post_attention_layernorm.weight"], eps)
        x = x + lin(silu(lin(h, sd, p + "mlp.gate_proj")) * lin(h, sd, p + "mlp.up_proj"), sd, p + "mlp.down_proj")
    x = rms_norm(x, sd["model.norm.weight"], eps)
    head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ head.t(), pats


def forward_gpt2(c, sd, tok):
    """modeling_gpt2.py: Conv1D (y = x @ W + b, W [in, out]), fused c_attn, learned wpe, gelu_new."""
    D, H = c["n_embd"], c["n_head"]
    d, eps = D // H, c["layer_norm_epsilon"]
    conv = lambda x, n: x @ sd[n + ".weight"] + sd[n + ".bias"]  # noqa: E731
    x = sd["wte.weight"][tok] + sd["wpe.weight"][: len(tok)]
    pats = []
    for l in range(c["n_layer"]):
        p = "h.%d." % l
        h = layer_norm(x, sd[p + "ln_1.weight"], sd[p + "ln_1.bias"], eps)
        q, k, v = conv(h, p + "attn.c_attn").split(D, dim=-1)
        z, pat = attend(heads(q, H, d), heads(k, H, d), heads(v, H, d), 1.0 / math.sqrt(d))
        pats.append(pat)
        x = x + conv(z, p + "attn.c_proj")
        h = layer_norm(x, sd[p + "ln_2.weight"], sd[p + "ln_2.bias"], eps)
        x = x + conv(gelu_tanh(conv(h, p + "mlp.c_fc")), p + "mlp.c_proj")
    x = layer_norm(x, sd["ln_f.weight"], sd["ln_f.bias"], eps)
    return x @ sd["wte.weight"].t(), pats   # lm_head tied to wte, no bias


def forward_neox(c, sd, tok):
    """modeling_gpt_neox.py: qkv viewed [T, H, 3*d] (per-head q|k|v), partial rotary, parallel residual."""
    D, H = c["hidden_size"], c["num_attention_heads"]
    d, eps = D // H, c["layer_norm_eps"]
    rot = int(d * c["rotary_pct"])
    f = inv_freq(rot, c["rotary_emb_base"])
    act = gelu_exact if c["hidden_act"] == "gelu" else gelu_tanh
    x = sd["gpt_neox.embed_in.weight"][tok]
    pats = []
    for l in range(c["num_hidden_layers"]):
        p = "gpt_neox.layers.%d." % l
        h = layer_norm(x, sd[p + "input_layernorm.weight"], sd[p + "input_layernorm.bias"], eps)
        qkv = lin(h, sd, p + "attention.query_key_value", True).view(len(tok), H, 3 * d).transpose(0, 1)
        q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
        z, pat = attend(rope(q, f), rope(k, f), v, 1.0 / math.sqrt(d))
        pats.append(pat)
        a = lin(z, sd, p + "attention.dense", True)
        mlp = lambda y: lin(act(lin(y, sd, p + "mlp.dense_h_to_4h", True)), sd, p + "mlp.dense_4h_to_h", True)  # noqa: E731
        ln2 = lambda y: layer_norm(y, sd[p + "post_attention_layernorm.weight"],  # noqa: E731
                                   sd[p + "post_attention_layernorm.bias"], eps)
        if c["use_parallel_residual"]:
            x = x + a + mlp(ln2(x))
        else:
            x = x + a
            x = x + mlp(ln2(x))
    x = layer_norm(x, sd["gpt_neox.final_layer_norm.weight"], sd["gpt_neox.final_layer_norm.bias"], eps)
    return x @ sd["embed_out.weight"].t(), pats


def gemma_layer_kinds(c, version):
    L = c["num_hidden_layers"]
    if version == 1:
        return [False] * L
    if version == 2:              # Gemma2DecoderLayer: is_sliding = not bool(layer_idx % 2)
        return [l % 2 == 0 for l in range(L)]
    pat = c["sliding_window_pattern"]   # Gemma3 (v4.50): is_sliding = bool((layer_idx + 1) % pattern)
    return [bool((l + 1) % pat) for l in range(L)]


def forward_gemma(c, sd, tok, version):
    """modeling_gemma.py (1), modeling_gemma2.py (2), modeling_gemma3.py (3, text model)."""
    D, H, K, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    eps = c["rms_norm_eps"]
    scale = c["query_pre_attn_scalar"] ** -0.5 if version > 1 else d ** -0.5
    cap = (c.get("attn_logit_softcapping") or 0.0) if version > 1 else 0.0
    sliding = gemma_layer_kinds(c, version)
    f_global = inv_freq(d, c.get("rope_theta", 10000.0), c.get("rope_scaling"))
    f_local = inv_freq(d, c["rope_local_base_freq"]) if version == 3 else f_global
    x = sd["model.embed_tokens.weight"][tok] * (D ** 0.5)   # normalizer = hidden_size ** 0.5
    pats = []
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = gemma_norm(x, sd[p + "input_layernorm.weight"], eps)
        q = heads(lin(h, sd, p + "self_attn.q_proj"), H, d)
        k = heads(lin(h, sd, p + "self_attn.k_proj"), K, d)
        v = heads(lin(h, sd, p + "self_attn.v_proj"), K, d)
        if version == 3:          # Gemma3Attention: q_norm/k_norm (GemmaRMSNorm over head_dim) before RoPE
            q = gemma_norm(q, sd[p + "self_attn.q_norm.weight"], eps)
            k = gemma_norm(k, sd[p + "self_attn.k_norm.weight"], eps)
        f = f_local if sliding[l] else f_global
        z, pat = attend(rope(q, f), rope(k, f), v, scale, c["sliding_window"] if sliding[l] else 0, cap)
        pats.append(pat)
        a = lin(z, sd, p + "self_attn.o_proj")
        if version == 1:
            x = x + a
            h = gemma_norm(x, sd[p + "post_attention_layernorm.weight"], eps)
        else:
            x = x + gemma_norm(a, sd[p + "post_attention_layernorm.weight"], eps)
            h = gemma_norm(x, sd[p + "pre_feedforward_layernorm.weight"], eps)
        m = lin(gelu_tanh(lin(h, sd, p + "mlp.gate_proj")) * lin(h, sd, p + "mlp.up_proj"), sd, p + "mlp.down_proj")
        x = x + (m if version == 1 else gemma_norm(m, sd[p + "post_feedforward_layernorm.weight"], eps))
    x = gemma_norm(x, sd["model.norm.weight"], eps)
    logits = x @ sd["model.embed_tokens.weight"].t()
    fcap = c.get("final_logit_softcapping") if version > 1 else None
    if fcap:
        logits = torch.tanh(logits / fcap) * fcap
    return logits, pats


def forward_olmo2(c, sd, tok):
    """modeling_olmo2.py: q_norm/k_norm over the whole projection, norms after attention and MLP."""
    H, K = c["num_attention_heads"], c["num_key_value_heads"]
    d, eps = c["hidden_size"] // H, c["rms_norm_eps"]
    f = inv_freq(d, c.get("rope_theta", 10000.0))
    x = sd["model.embed_tokens.weight"][tok]
    pats = []
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        q = rms_norm(lin(x, sd, p + "self_attn.q_proj"), sd[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(lin(x, sd, p + "self_attn.k_proj"), sd[p + "self_attn.k_norm.weight"], eps)
        v = lin(x, sd, p + "self_attn.v_proj")
        z, pat = attend(rope(heads(q, H, d), f), rope(heads(k, K, d), f), heads(v, K, d), d ** -0.5)
        pats.append(pat)
        x = x + rms_norm(lin(z, sd, p + "self_attn.o_proj"), sd[p + "post_attention_layernorm.weight"], eps)
        m = lin(silu(lin(x, sd, p + "mlp.gate_proj")) * lin(x, sd, p + "mlp.up_proj"), sd, p + "mlp.down_proj")
        x = x + rms_norm(m, sd[p + "post_feedforward_layernorm.weight"], eps)
    x = rms_norm(x, sd["model.norm.weight"], eps)
    return x @ sd["lm_head.weight"].t(), pats


# ---------------------------------------------------------------- random checkpoints

class Gen:
    """Random tensors rounded to float16 (what is stored) and kept as float64 (what is computed)."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.sd = {}

    def add(self, name, shape, std=None, mean=0.0):
        fan_in = shape[-1] if len(shape) > 1 else 1
        s = std if std is not None else 1.0 / math.sqrt(fan_in)
        t = (torch.randn(*shape, generator=self.g, dtype=F64) * s + mean).to(torch.float16).to(F64)
        self.sd[name] = t
        return t


def llama_like_weights(c, g, qk_norm=False, qkv_bias=False, o_bias=False, tied=True):
    D, H, K, F = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    d = c.get("head_dim") or D // H
    g.add("model.embed_tokens.weight", [VOCAB, D], std=1.0)
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        g.add(p + "input_layernorm.weight", [D], 0.1, 1.0)
        g.add(p + "post_attention_layernorm.weight", [D], 0.1, 1.0)
        for n, rows in (("q", H * d), ("k", K * d), ("v", K * d)):
            g.add(p + "self_attn.%s_proj.weight" % n, [rows, D], 2.0 / math.sqrt(D))
            if qkv_bias:
                g.add(p + "self_attn.%s_proj.bias" % n, [rows], 0.3)
        g.add(p + "self_attn.o_proj.weight", [D, H * d])
        if o_bias:
            g.add(p + "self_attn.o_proj.bias", [D], 0.1)
        if qk_norm:
            g.add(p + "self_attn.q_norm.weight", [d], 0.2, 1.0)
            g.add(p + "self_attn.k_norm.weight", [d], 0.2, 1.0)
        g.add(p + "mlp.gate_proj.weight", [F, D])
        g.add(p + "mlp.up_proj.weight", [F, D])
        g.add(p + "mlp.down_proj.weight", [D, F])
    g.add("model.norm.weight", [D], 0.1, 1.0)
    if not tied:
        g.add("lm_head.weight", [VOCAB, D])


def base_cfg(arch, model_type, **kw):
    c = {"architectures": [arch], "model_type": model_type, "vocab_size": VOCAB, "hidden_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False, "torch_dtype": "float16"}
    c.update(kw)
    return c


def make_llama3(seed):
    c = base_cfg("LlamaForCausalLM", "llama", hidden_size=48, rope_theta=10000.0,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    g = Gen(seed)
    llama_like_weights(c, g, tied=False)
    return c, g.sd, forward_llama


def make_mistral(seed):
    c = base_cfg("MistralForCausalLM", "mistral", sliding_window=5, num_hidden_layers=2)
    g = Gen(seed)
    llama_like_weights(c, g, tied=False)
    return c, g.sd, forward_llama


def make_qwen2(seed):
    c = base_cfg("Qwen2ForCausalLM", "qwen2", use_sliding_window=False, tie_word_embeddings=False)
    g = Gen(seed)
    llama_like_weights(c, g, qkv_bias=True, tied=False)
    return c, g.sd, forward_llama


def make_qwen3(seed):
    c = base_cfg("Qwen3ForCausalLM", "qwen3", head_dim=16, attention_bias=False, use_sliding_window=False,
                 tie_word_embeddings=True)
    g = Gen(seed)
    llama_like_weights(c, g, qk_norm=True, tied=True)
    return c, g.sd, forward_llama


def make_olmo2(seed):
    c = base_cfg("Olmo2ForCausalLM", "olmo2", attention_bias=False, rope_scaling=None)
    g = Gen(seed)
    D, H, K, F = 32, 4, 2, 64
    d = D // H
    g.add("model.embed_tokens.weight", [VOCAB, D], std=1.0)
    for l in range(2):
        p = "model.layers.%d." % l
        g.add(p + "self_attn.q_proj.weight", [H * d, D])
        g.add(p + "self_attn.k_proj.weight", [K * d, D])
        g.add(p + "self_attn.v_proj.weight", [K * d, D])
        g.add(p + "self_attn.o_proj.weight", [D, H * d])
        g.add(p + "self_attn.q_norm.weight", [H * d], 0.3, 1.5)
        g.add(p + "self_attn.k_norm.weight", [K * d], 0.3, 1.5)
        g.add(p + "post_attention_layernorm.weight", [D], 0.1, 1.0)
        g.add(p + "post_feedforward_layernorm.weight", [D], 0.1, 1.0)
        g.add(p + "mlp.gate_proj.weight", [F, D])
        g.add(p + "mlp.up_proj.weight", [F, D])
        g.add(p + "mlp.down_proj.weight", [D, F])
    g.add("model.norm.weight", [D], 0.1, 1.0)
    g.add("lm_head.weight", [VOCAB, D])
    return c, g.sd, forward_olmo2


def make_gpt2(seed):
    # n_embd 32 with c_attn [32, 96]: not square, so a missing Conv1D transpose cannot pass.
    c = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": VOCAB, "n_embd": 32,
         "n_layer": 2, "n_head": 4, "n_positions": 32, "n_ctx": 32, "n_inner": None,
         "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
         "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
         "torch_dtype": "float16"}
    g = Gen(seed)
    D, F = 32, 128
    g.add("wte.weight", [VOCAB, D], std=1.0)
    g.add("wpe.weight", [32, D], std=0.5)
    for l in range(2):
        p = "h.%d." % l
        for ln in ("ln_1", "ln_2"):
            g.add(p + ln + ".weight", [D], 0.1, 1.0)
            g.add(p + ln + ".bias", [D], 0.1)
        for n, i, o in (("attn.c_attn", D, 3 * D), ("attn.c_proj", D, D), ("mlp.c_fc", D, F), ("mlp.c_proj", F, D)):
            g.add(p + n + ".weight", [i, o], (2.0 if n == "attn.c_attn" else 1.0) / math.sqrt(i))  # Conv1D [in, out]
            g.add(p + n + ".bias", [o], 0.1)
    g.add("ln_f.weight", [D], 0.1, 1.0)
    g.add("ln_f.bias", [D], 0.1)
    return c, g.sd, forward_gpt2


def neox_weights(g, D, F):
    """Two GPT-NeoX layers with biases everywhere (shared by the parallel and sequential fixtures)."""
    g.add("gpt_neox.embed_in.weight", [VOCAB, D], std=1.0)
    for l in range(2):
        p = "gpt_neox.layers.%d." % l
        for ln in ("input_layernorm", "post_attention_layernorm"):
            g.add(p + ln + ".weight", [D], 0.1, 1.0)
            g.add(p + ln + ".bias", [D], 0.1)
        g.add(p + "attention.query_key_value.weight", [3 * D, D], 2.0 / math.sqrt(D))  # rows [H, 3, d]
        g.add(p + "attention.query_key_value.bias", [3 * D], 0.3)
        g.add(p + "attention.dense.weight", [D, D])
        g.add(p + "attention.dense.bias", [D], 0.1)
        g.add(p + "mlp.dense_h_to_4h.weight", [F, D])
        g.add(p + "mlp.dense_h_to_4h.bias", [F], 0.1)
        g.add(p + "mlp.dense_4h_to_h.weight", [D, F])
        g.add(p + "mlp.dense_4h_to_h.bias", [D], 0.1)
    g.add("gpt_neox.final_layer_norm.weight", [D], 0.1, 1.0)
    g.add("gpt_neox.final_layer_norm.bias", [D], 0.1)
    g.add("embed_out.weight", [VOCAB, D])


def make_neox(seed):
    c = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": VOCAB,
         "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
         "max_position_embeddings": 64, "rotary_pct": 0.25, "rotary_emb_base": 10000, "layer_norm_eps": 1e-5,
         "hidden_act": "gelu", "use_parallel_residual": True, "tie_word_embeddings": False,
         "attention_bias": True, "torch_dtype": "float16"}
    g = Gen(seed)
    neox_weights(g, 64, 96)
    return c, g.sd, forward_neox


def make_neox_sequential(seed):
    # The other NeoX branch: x = x + attn(ln1(x)); x = x + mlp(ln2(x)); half the head rotated.
    c = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": VOCAB,
         "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
         "max_position_embeddings": 64, "rotary_pct": 0.5, "rotary_emb_base": 100, "layer_norm_eps": 1e-5,
         "hidden_act": "gelu", "use_parallel_residual": False, "tie_word_embeddings": False,
         "torch_dtype": "float16"}
    g = Gen(seed)
    neox_weights(g, 32, 64)
    return c, g.sd, forward_neox


def gemma_weights(c, g, version):
    D, H, K, F, d = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                     c["intermediate_size"], c["head_dim"])
    g.add("model.embed_tokens.weight", [VOCAB, D], std=0.3)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if version > 1:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        for n in norms:
            g.add(p + n + ".weight", [D], 0.3)          # stored as w, applied as (1 + w)
        for n, rows in (("q", H * d), ("k", K * d), ("v", K * d)):
            g.add(p + "self_attn.%s_proj.weight" % n, [rows, D], 2.0 / math.sqrt(D))
        g.add(p + "self_attn.o_proj.weight", [D, H * d])
        if version == 3:
            g.add(p + "self_attn.q_norm.weight", [d], 0.3)
            g.add(p + "self_attn.k_norm.weight", [d], 0.3)
        g.add(p + "mlp.gate_proj.weight", [F, D])
        g.add(p + "mlp.up_proj.weight", [F, D])
        g.add(p + "mlp.down_proj.weight", [D, F])
    g.add("model.norm.weight", [D], 0.3)


def make_gemma(seed):
    # head_dim 16 != hidden_size / heads (8), one kv head as in gemma-2b.
    c = base_cfg("GemmaForCausalLM", "gemma", head_dim=16, num_key_value_heads=1, hidden_act="gelu",
                 hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    g = Gen(seed)
    gemma_weights(c, g, 1)
    return c, g.sd, lambda c, sd, t: forward_gemma(c, sd, t, 1)


def make_gemma2(seed):
    c = base_cfg("Gemma2ForCausalLM", "gemma2", head_dim=16, num_hidden_layers=3, hidden_act="gelu_pytorch_tanh",
                 hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                 final_logit_softcapping=3.0, sliding_window=5, tie_word_embeddings=True)
    g = Gen(seed)
    gemma_weights(c, g, 2)
    return c, g.sd, lambda c, sd, t: forward_gemma(c, sd, t, 2)


def make_gemma3(seed):
    c = base_cfg("Gemma3ForCausalLM", "gemma3_text", head_dim=16, num_hidden_layers=3,
                 hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16, sliding_window=6,
                 sliding_window_pattern=2, rope_theta=1000000.0, rope_local_base_freq=10.0,
                 rope_scaling={"rope_type": "linear", "factor": 4.0}, attn_logit_softcapping=None,
                 final_logit_softcapping=None, tie_word_embeddings=True)
    c.pop("hidden_act")
    g = Gen(seed)
    gemma_weights(c, g, 3)
    return c, g.sd, lambda c, sd, t: forward_gemma(c, sd, t, 3)


FIXTURES = {
    "gpt2": make_gpt2, "gpt_neox": make_neox, "gpt_neox_sequential": make_neox_sequential, "gemma": make_gemma, "gemma2": make_gemma2, "gemma3": make_gemma3,
    "olmo2": make_olmo2, "qwen3": make_qwen3, "llama3_rope": make_llama3, "mistral_window": make_mistral,
    "qwen2_bias": make_qwen2,
}


def check_with_transformers(folder, tok, logits):
    try:
        import transformers
    except ImportError:
        return "transformers not importable: skipped"
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=F64, attn_implementation="eager")
    with torch.no_grad():
        out = model(tok.unsqueeze(0)).logits[0]
    err = (out - logits).abs().max().item()
    # transformers computes RMSNorm and the RoPE angles in float32 even in a float64 model, so
    # agreement is to float32 precision, not float64.
    if err > 2e-4:
        raise SystemExit("%s: transformers %s disagrees with the reference: max |diff| %.3g"
                         % (folder, transformers.__version__, err))
    return "transformers %s agrees (max |diff| %.2g)" % (transformers.__version__, err)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder to write <name>/ fixtures into")
    ap.add_argument("--only", nargs="*", help="fixture names (default: all)")
    args = ap.parse_args()
    tok = torch.randint(0, VOCAB, (T_SEQ,), generator=torch.Generator().manual_seed(1234))
    for name, make in sorted(FIXTURES.items()):
        if args.only and name not in args.only:
            continue
        c, sd, fwd = make(zlib.crc32(name.encode()))  # a seed per name, stable as fixtures are added
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        write_safetensors(os.path.join(folder, "model.safetensors"), {k: v.to(torch.float16) for k, v in sd.items()})
        logits, pats = fwd(c, sd, tok)
        write_safetensors(os.path.join(folder, "reference.safetensors"),
                          {"tokens": tok.clone(), "logits": logits.to(torch.float32),
                           "patterns": torch.stack(pats).to(torch.float32)})
        print("%-15s logits std %.3f, |logit| max %.2f; %s" % (name, logits.std().item(), logits.abs().max().item(),
                                                              check_with_transformers(folder, tok, logits)))


if __name__ == "__main__":
    main()
