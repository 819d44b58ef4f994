#!/usr/bin/env python3
"""Converts a Hugging Face checkpoint folder into a GGUF v3 file the way llama.cpp's converter does.

    make_gguf.py SRC OUT.gguf --outtype {f32,f16,bf16,q8_0} [--tokenizer DIR] [--vocab-only]
                 [--arch NAME] [--strict-converter]

Runs in the environment scripts/setup_gguf.sh makes (PyPI's gguf 0.18.0 + numpy; no torch, no
transformers): tensors are read from SRC/model*.safetensors with numpy, written with
gguf.GGUFWriter and quantized with gguf.quants.quantize, so the bytes are llama.cpp's own.

The model classes below follow llama.cpp's convert_hf_to_gguf.py at commit
21a493304229be58de148fde3b633017db0a0524 (2026-04-12, "mtmd: qwen3 audio support", #19441; the
last commit touching the converter and gguf-py before 2026-04-24). Comments cite it as
"C@L<n>" = convert_hf_to_gguf.py@21a4933 line n. Architectures: LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM,
Gemma3ForCausalLM (text), Olmo2ForCausalLM, GPT2LMHeadModel, GPTNeoXForCausalLM.

Where the converter needs transformers (AutoConfig, AutoTokenizer) this reads the JSON files
itself: hparams are config.json as written (the converter's own fallback, C@L953-968), so keys
AutoConfig would add as defaults (e.g. LlamaConfig.head_dim -> attention.key_length) are absent
unless config.json has them.

Deviations (all off with --strict-converter, which writes what the converter would):
  D1 tied weights stored under one name (safetensors' __metadata__ alias, e.g. tinystories-656k
     stores only lm_head.weight and maps model.embed_tokens.weight to it): the converter ignores
     __metadata__ (gguf.utility.SafetensorsLocal) and would write output.weight with no
     token_embd.weight, a file llama.cpp cannot load. Here the alias is resolved and, the model
     being tied, written once as token_embd.weight (no output.weight), as for a normally saved
     tied checkpoint.
  D2 "llama" tokenizer from tokenizer.json (LlamaHfVocab): the converter writes score -1000.0 for
     every token (gguf-py vocab.py LlamaHfVocab.get_token_score), which makes llama.cpp's
     score-driven SPM tokenizer merge left to right instead of in tokenizer.json's merge order.
     Here score(token) = -(rank of the first merge producing it); tokens no merge produces
     (single characters, bytes, specials) get -(number of merges), below every merged token.
  D3 llama3 rope_freqs: the converter reads the original context length from the top-level
     hparams only (C@L2963, default 8192); config.json keeps it inside rope_scaling. Here
     rope_scaling's value is used when the top level has none (equal for every published
     Llama 3.x, different for the llama3_rope fixture).
  D4 keys llama.cpp reads but the converter leaves out, written only where llama.cpp's default
     differs from the checkpoint: gptneox.rope.freq_base (llama.cpp default 10000) and
     gemma3.attention.sliding_window_pattern (llama.cpp default 6), gemma/gemma2 rope.freq_base.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import struct
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError:  # pragma: no cover
    sys.exit("make_gguf.py: needs PyPI's gguf (run scripts/setup_gguf.sh and use the python it prints)")

CONVERTER_COMMIT = "21a493304229be58de148fde3b633017db0a0524"

ARCH_OF = {  # HF architecture -> gguf.MODEL_ARCH (C@L2796-2806, L3780-3789, L4636-4638, L7013-7015, L7061-7063, L7105-7107, L8538-8541, L5424-5426, L2273-2275)
    "LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "MistralForCausalLM": gguf.MODEL_ARCH.LLAMA,
    "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2,
    "Qwen3ForCausalLM": gguf.MODEL_ARCH.QWEN3,
    "GemmaForCausalLM": gguf.MODEL_ARCH.GEMMA,
    "Gemma2ForCausalLM": gguf.MODEL_ARCH.GEMMA2,
    "Gemma3ForCausalLM": gguf.MODEL_ARCH.GEMMA3,
    "Olmo2ForCausalLM": gguf.MODEL_ARCH.OLMO2,
    "GPT2LMHeadModel": gguf.MODEL_ARCH.GPT2,
    "GPTNeoXForCausalLM": gguf.MODEL_ARCH.GPTNEOX,
}

FTYPE = {  # --outtype -> (general.file_type, tensor type for "quantizable" tensors) (C@L858-871)
    "f32": (gguf.LlamaFileType.ALL_F32, QT.F32),
    "f16": (gguf.LlamaFileType.MOSTLY_F16, QT.F16),
    "bf16": (gguf.LlamaFileType.MOSTLY_BF16, QT.BF16),
    "q8_0": (gguf.LlamaFileType.MOSTLY_Q8_0, QT.Q8_0),
}


class ConvertError(Exception):
    pass


# --------------------------------------------------------------------------- safetensors

def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """name -> array in the dtype the converter computes in: F16 and F32 as stored, BF16 (and
    anything else float) widened to F32 (C@L783-785). Returns (tensors, __metadata__)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None) or {}
    out: dict[str, np.ndarray] = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        lo, hi = info["data_offsets"]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        buf = data[base + lo: base + hi]
        if dt == "F16":
            arr = np.frombuffer(buf, dtype="<f2").reshape(shape).copy()
        elif dt == "F32":
            arr = np.frombuffer(buf, dtype="<f4").reshape(shape).copy()
        elif dt == "BF16":
            arr = _bf16_to_f32(np.frombuffer(buf, dtype="<u2")).reshape(shape)
        elif dt == "F64":
            arr = np.frombuffer(buf, dtype="<f8").reshape(shape).astype(np.float32)
        else:
            raise ConvertError(f"{path.name}: tensor {name!r} has dtype {dt}; only F16/F32/BF16/F64 are read")
        out[name] = arr
    return out, meta


def load_model_tensors(src: Path, strict: bool, hparams: dict) -> dict[str, np.ndarray]:
    # the converter reads every model*.safetensors part, sorted (C@L202-205, L942-950)
    parts = sorted(p for p in src.iterdir() if p.name.startswith("model") and p.name.endswith(".safetensors"))
    if not parts:
        raise ConvertError(f"{src}: no model*.safetensors")
    tensors: dict[str, np.ndarray] = {}
    aliases: dict[str, str] = {}
    for p in parts:
        t, meta = read_safetensors(p)
        tensors.update(t)
        aliases.update({k: v for k, v in meta.items() if isinstance(v, str) and v in t})
    if not strict:
        # D1: resolve safetensors' shared-tensor aliases; a tied model is written once, as token_embd
        for alias, target in aliases.items():
            if alias not in tensors and re.search(r"\.(weight|bias)$", alias):
                tensors[alias] = tensors[target]
                if hparams.get("tie_word_embeddings") and target == "lm_head.weight" and alias.endswith("embed_tokens.weight"):
                    del tensors[target]
    return tensors


# --------------------------------------------------------------------------- helpers

def find_hparam(h: dict, keys, optional=False):
    # C@L182-188: the first key PRESENT wins, even when its value is null
    key = next((k for k in keys if k in h), None)
    if key is not None:
        return h[key]
    if optional:
        return None
    raise ConvertError(f"config.json: none of {keys}")


def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    # C@L2873-2879: LlamaModel.permute (HF rotate_half rows -> llama.cpp's interleaved pairs)
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def llama3_rope_factors(hparams: dict, rope_params: dict, strict: bool) -> np.ndarray:
    # C@L2952-2980: LlamaModel.generate_extra_tensors, in float32 like the torch original
    # (numpy >= 2 keeps python-scalar arithmetic on float32 values in float32, as torch does)
    base = rope_params.get("rope_theta", 10000.0)
    dim = hparams.get("head_dim")
    if dim is None:
        dim = hparams["hidden_size"] // hparams["num_attention_heads"]
    freqs = np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor = rope_params.get("factor", 8.0)
    low_freq_factor = rope_params.get("low_freq_factor", 1.0)
    high_freq_factor = rope_params.get("high_freq_factor", 4.0)
    old_context_len = hparams.get("original_max_position_embeddings")
    if old_context_len is None and not strict:  # D3
        old_context_len = rope_params.get("original_max_position_embeddings")
    if old_context_len is None:
        old_context_len = 8192
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (np.float32(old_context_len) / wavelen - np.float32(low_freq_factor)) / np.float32(high_freq_factor - low_freq_factor)
            out.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    return np.array(out, dtype=np.float32)


# --------------------------------------------------------------------------- the model

class Converter:
    def __init__(self, src: Path, outtype: str, strict: bool, tokenizer_dir: Path | None):
        self.src = src
        self.strict = strict
        self.tokenizer_dir = tokenizer_dir or src
        with open(src / "config.json", encoding="utf-8") as f:
            self.hparams: dict = json.load(f)
        if "text_config" in self.hparams:  # C@L1022-1024
            self.hparams = {**self.hparams, **self.hparams["text_config"]}
        arch_names = self.hparams.get("architectures") or []
        if not arch_names or arch_names[0] not in ARCH_OF:
            raise ConvertError(f"{src}: architecture {arch_names[:1]} is not one make_gguf.py converts ({', '.join(ARCH_OF)})")
        self.hf_arch = arch_names[0]
        self.model_arch = ARCH_OF[self.hf_arch]
        self.arch = gguf.MODEL_ARCH_NAMES[self.model_arch]
        self.ftype, self.qtype = FTYPE[outtype]
        # C@L1026-1041: block count, tensor map, rope parameters (rope_theta mirrored inside)
        self.block_count = find_hparam(self.hparams, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"])
        self.tensor_map = gguf.get_tensor_name_map(self.model_arch, self.block_count)
        rp = self.hparams.get("rope_parameters", self.hparams.get("rope_scaling")) or {}
        self.rope_parameters = dict(rp)
        rope_theta = find_hparam(self.hparams, ["global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"], optional=True)
        local_rope_theta = find_hparam(self.hparams, ["local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta", "rope_local_base_freq"], optional=True)
        if "full_attention" not in self.rope_parameters and "sliding_attention" not in self.rope_parameters:
            if local_rope_theta is not None:
                self.rope_parameters["sliding_attention"] = {"rope_theta": local_rope_theta}
            if "rope_theta" not in self.rope_parameters and rope_theta is not None:
                self.rope_parameters["rope_theta"] = rope_theta
            if "rope_type" not in self.rope_parameters and (rope_type := self.rope_parameters.get("type")) is not None:
                self.rope_parameters["rope_type"] = rope_type
        self.w = gguf.GGUFWriter(path=None, arch=self.arch)  # writes general.architecture first

    # ---- tensors -----------------------------------------------------------------------

    def map_name(self, name: str) -> str:
        new = self.tensor_map.get_name(key=name, try_suffixes=(".weight", ".bias"))  # C@L535-539
        if new is None:
            raise ConvertError(f"can not map tensor {name!r}")
        return new

    def extra_tensors(self):
        if self.model_arch == gguf.MODEL_ARCH.LLAMA:
            rp = self.rope_parameters.get("full_attention", self.rope_parameters)
            if rp and rp.get("rope_type", "").lower() == "llama3":
                yield gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(self.hparams, rp, self.strict)

    def modify(self, data: np.ndarray, name: str):
        """Yields (gguf name, array) for one HF tensor, per model class."""
        h = self.hparams
        a = self.model_arch
        if a == gguf.MODEL_ARCH.LLAMA:
            # C@L2883-2950 (vision prefixes are not in text checkpoints)
            n_head = find_hparam(h, ["n_heads", "num_attention_heads"])
            n_kv_head = find_hparam(h, ["n_kv_heads", "num_key_value_heads"])
            if name.endswith(("q_proj.weight", "q_proj.bias")):   # C@L2914-2915
                data = llama_permute(data, n_head, n_head)
            if name.endswith(("k_proj.weight", "k_proj.bias")):   # C@L2916-2917
                data = llama_permute(data, n_head, n_kv_head)
            if "block_sparse_moe.experts" in name:
                raise ConvertError("Mixtral experts are not converted here")
        elif a in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2):
            if name == "lm_head.weight":  # C@L7050-7052, L7094-7096: skipped (always tied)
                return
            if name.endswith("norm.weight"):  # C@L7055-7056, L7099-7100: (1 + w) RMSNorm
                data = data + data.dtype.type(1)
        elif a == gguf.MODEL_ARCH.GEMMA3:
            name = name.replace("language_model.", "")  # C@L7139-7140
            if name.startswith(("multi_modal_projector.", "vision_tower.", "multimodal_projector.", "vision_model.")):
                return  # C@L7142-7144
            if "embed_tokens.weight" in name:  # C@L7147-7156: drop rows past the tokenizer's vocabulary
                n_vocab_real = self.gemma3_vocab_rows()
                if n_vocab_real is not None:
                    data = data[:n_vocab_real]
            if name.endswith("norm.weight"):  # C@L7108-7110, L7161-7163: Gemma3RMSNorm (1 + w), q/k norms too
                data = data + data.dtype.type(1)
        elif a == gguf.MODEL_ARCH.GPT2:
            if name.endswith((".attn.bias", ".attn.masked_bias")):
                return  # causal-mask buffers (the converter passes them on, C@L5438-5441; no GGUF name)
            if name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight")):  # C@L5443-5444: Conv1D [in,out] -> [out,in]
                data = np.ascontiguousarray(data.transpose(1, 0))
        elif a == gguf.MODEL_ARCH.GPTNEOX:
            # C@L2289-2321: per-head [q,k,v] blocks -> [all q; all k; all v]
            n_head = h.get("n_head", h.get("num_attention_heads"))
            n_embed = h.get("hidden_size", h.get("n_embed"))
            if re.match(r"gpt_neox\.layers\.\d+\.attention\.query_key_value\.weight", name):
                qkv = data.reshape((n_head, 3, n_embed // n_head, n_embed))
                data = np.concatenate([qkv[:, i, :, :].reshape((-1, n_embed)) for i in range(3)], axis=0)
            elif re.match(r"gpt_neox\.layers\.\d+\.attention\.query_key_value\.bias", name):
                qkv = data.reshape((n_head, 3, n_embed // n_head))
                data = np.concatenate([qkv[:, i, :].reshape((n_embed,)) for i in range(3)], axis=0)
        elif a in (gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.QWEN3, gguf.MODEL_ARCH.OLMO2):
            pass  # C@L3801-3812, L4717-4736, (Olmo2: TextModel's): names mapped as they are, no permute
        yield self.map_name(name), data

    def gemma3_vocab_rows(self) -> int | None:
        tj = self.src / "tokenizer.json"
        if (self.src / "tokenizer.model").is_file():
            raise ConvertError("gemma3 with tokenizer.model needs sentencepiece (not in this environment)")
        if not tj.is_file():
            return None  # the converter would fail here; tokenizer-less fixtures keep every row
        with open(tj, encoding="utf-8") as f:
            t = json.load(f)
        return len(t["model"]["vocab"]) + len(t["added_tokens"])

    def tensor_type(self, new_name: str, data: np.ndarray) -> QT:
        # C@L798-871: the converter's dtype rules
        n_dims = data.ndim
        bid = None
        for part in new_name.split("."):
            if part.isdecimal():
                bid = int(part)
                break
        qtype = None
        if n_dims <= 1 or new_name.endswith("_norm.weight"):  # C@L802-804
            qtype = QT.F32
        always_f32 = [gguf.MODEL_TENSOR.FFN_GATE_INP, gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES]
        if qtype is None and (any(self.match_name(new_name, k, bid) for k in always_f32)  # C@L806-838
                              or new_name[-7:] not in (".weight", ".lora_a", ".lora_b")):
            qtype = QT.F32
        return qtype if qtype is not None else self.qtype

    def match_name(self, name: str, key, bid) -> bool:  # C@L522-533
        if key not in gguf.MODEL_TENSORS[self.model_arch]:
            return False
        key_name = gguf.TENSOR_NAMES[key]
        if "{bid}" in key_name:
            if bid is None:
                return False
            key_name = key_name.format(bid=bid)
        elif bid is not None:
            return False
        return name == key_name + ".weight"

    def add_tensors(self):
        tensors = load_model_tensors(self.src, self.strict, self.hparams)
        items = list(self.extra_tensors()) + list(tensors.items())
        for name, data in items:
            if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
                continue  # C@L777-779
            if data.dtype not in (np.float16, np.float32):  # C@L783-785
                data = data.astype(np.float32)
            for new_name, arr in self.modify(data, name):
                qtype = self.tensor_type(new_name, arr)
                try:
                    out = gguf.quants.quantize(arr, qtype)
                except gguf.QuantError:
                    # C@L875-880: a row length that is not a multiple of the block (32 for Q8_0) -> F16
                    qtype = QT.F16
                    out = gguf.quants.quantize(arr, qtype)
                self.w.add_tensor(new_name, out, raw_dtype=qtype)

    # ---- metadata ----------------------------------------------------------------------

    def general(self):
        # C@L895-928: general.type, model-card metadata (name falls back to the folder name), size label
        total, shared, expert, count = self.w.get_total_parameter_count()
        md = gguf.Metadata.load(None, self.src, None, total)
        if md.name is None:
            md.name = self.src.name
        if md.size_label is None and total > 0:
            md.size_label = gguf.size_label(total, shared, expert, count)
        self.w.add_type(gguf.GGUFType.MODEL)
        md.set_gguf_meta_model(self.w)

    def text_model_params(self):
        # C@L1081-1191: TextModel.set_gguf_parameters
        h, w = self.hparams, self.w
        w.add_block_count(self.block_count)
        if (n_ctx := find_hparam(h, ["max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length", "model_max_length"], True)) is not None:
            w.add_context_length(n_ctx)
        if (n_embd := find_hparam(h, ["hidden_size", "n_embd", "dim"], True)) is not None:
            w.add_embedding_length(n_embd)
        if (n_ff := find_hparam(h, ["intermediate_size", "n_inner", "hidden_dim"], True)) is not None:
            w.add_feed_forward_length(n_ff)
        if (n_head := find_hparam(h, ["num_attention_heads", "n_head", "n_heads"], True)) is not None:
            w.add_head_count(n_head)
        if (n_head_kv := find_hparam(h, ["num_key_value_heads", "n_kv_heads"], True)) is not None:
            w.add_head_count_kv(n_head_kv)
        if h.get("is_causal") is False:
            w.add_causal_attention(False)
        rope_params = self.rope_parameters.get("full_attention", self.rope_parameters)
        if (rope_type := rope_params.get("rope_type")) is not None:
            factor = rope_params.get("factor")
            if rope_type == "linear" and factor is not None:
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
                w.add_rope_scaling_factor(factor)
            elif rope_type == "yarn" and factor is not None:
                w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
                w.add_rope_scaling_factor(factor)
                w.add_rope_scaling_orig_ctx_len(rope_params["original_max_position_embeddings"])
                if (v := rope_params.get("extrapolation_factor")) is not None:
                    w.add_rope_scaling_yarn_ext_factor(v)
                if (v := rope_params.get("attention_factor", rope_params.get("attn_factor"))) is not None:
                    w.add_rope_scaling_yarn_attn_factor(v)
                if (v := rope_params.get("beta_fast")) is not None:
                    w.add_rope_scaling_yarn_beta_fast(v)
                if (v := rope_params.get("beta_slow")) is not None:
                    w.add_rope_scaling_yarn_beta_slow(v)
            elif rope_type in ("su", "longrope"):
                w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
            # "llama3": the rope_freqs tensor (extra_tensors); "default"/"dynamic": nothing
        if (theta := rope_params.get("rope_theta")) is not None:
            w.add_rope_freq_base(theta)
        if (local := self.rope_parameters.get("sliding_attention", {}).get("rope_theta")) is not None:
            w.add_rope_freq_base_swa(local)
        if (eps := find_hparam(h, ["rms_norm_eps", "norm_eps"], True)) is not None:
            w.add_layer_norm_rms_eps(eps)
        if (eps := find_hparam(h, ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"], True)) is not None:
            w.add_layer_norm_eps(eps)
        if find_hparam(h, ["num_local_experts", "num_experts"], True) is not None:
            raise ConvertError("mixture-of-experts checkpoints are not converted here")
        if (head_dim := h.get("head_dim")) is not None:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        w.add_file_type(self.ftype)

    def model_params(self):
        h, w, a = self.hparams, self.w, self.model_arch
        if a == gguf.MODEL_ARCH.LLAMA:  # C@L2862-2871
            self.text_model_params()
            w.add_vocab_size(h["vocab_size"])
            rope_dim = h.get("head_dim")
            if rope_dim is None:
                rope_dim = h["hidden_size"] // h["num_attention_heads"]
            w.add_rope_dimension_count(rope_dim)
        elif a in (gguf.MODEL_ARCH.QWEN2, gguf.MODEL_ARCH.QWEN3):  # C@L3797-3799, L4699-4709 (no pooling file)
            self.text_model_params()
        elif a in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2):  # C@L7033-7045, L7070-7089
            w.add_context_length(h["max_position_embeddings"])
            w.add_embedding_length(h["hidden_size"])
            w.add_block_count(self.block_count)
            w.add_feed_forward_length(h["intermediate_size"])
            w.add_head_count(h["num_attention_heads"])
            w.add_head_count_kv(h["num_key_value_heads"] if "num_key_value_heads" in h else h["num_attention_heads"])
            w.add_layer_norm_rms_eps(h["rms_norm_eps"])
            w.add_key_length(h["head_dim"])
            w.add_value_length(h["head_dim"])
            w.add_file_type(self.ftype)
            if a == gguf.MODEL_ARCH.GEMMA2:
                w.add_attn_logit_softcapping(h["attn_logit_softcapping"])
                w.add_final_logit_softcapping(h["final_logit_softcapping"])
                w.add_sliding_window(h["sliding_window"])
            theta = self.rope_parameters.get("rope_theta")
            if not self.strict and theta is not None and float(theta) != 10000.0:
                w.add_rope_freq_base(theta)  # D4: the converter writes none; llama.cpp's default is 10000
        elif a == gguf.MODEL_ARCH.GEMMA3:  # C@L7119-7136 (TextModel's keys, then these overwrite)
            self.text_model_params()
            w.add_context_length(h.get("max_position_embeddings", 131072))
            w.add_head_count(h.get("num_attention_heads", 8))
            w.add_layer_norm_rms_eps(h.get("rms_norm_eps", 1e-6))
            w.add_key_length(h.get("head_dim", 256))
            w.add_value_length(h.get("head_dim", 256))
            w.add_rope_freq_base(self.rope_parameters.get("full_attention", self.rope_parameters).get("rope_theta", 1_000_000.0))
            if h.get("attn_logit_softcapping") is not None:
                raise ConvertError("gemma3: attn_logit_softcapping must be null (C@L7131)")
            if final := h.get("final_logit_softcapping"):
                w.add_final_logit_softcapping(final)
            if h.get("sliding_window_pattern") != 1:
                w.add_sliding_window(h["sliding_window"])
                pattern = h.get("sliding_window_pattern")
                if not self.strict and isinstance(pattern, int) and pattern != 6:
                    w.add_sliding_window_pattern(pattern)  # D4: llama.cpp reads it (default 6); the converter does not write it
            w.add_head_count_kv(h.get("num_key_value_heads", 4))
        elif a == gguf.MODEL_ARCH.OLMO2:  # C@L8543-8558
            self.text_model_params()
            if "sliding_window" in h:
                w.add_sliding_window(h["sliding_window"])
                if "layer_types" in h:
                    pattern = [t == "sliding_attention" for t in h["layer_types"]]
                else:
                    pattern = [(i + 1) % 4 != 0 for i in range(h["num_hidden_layers"])]
                w.add_sliding_window_pattern(pattern)
        elif a == gguf.MODEL_ARCH.GPT2:  # C@L5428-5435
            w.add_block_count(self.block_count)
            w.add_context_length(h["n_ctx"])
            w.add_embedding_length(h["n_embd"])
            w.add_feed_forward_length(4 * h["n_embd"])
            w.add_head_count(h["n_head"])
            w.add_layer_norm_eps(h["layer_norm_epsilon"])
            w.add_file_type(self.ftype)
        elif a == gguf.MODEL_ARCH.GPTNEOX:  # C@L2277-2287 (no file_type, no head_count_kv, no freq_base)
            w.add_context_length(h["max_position_embeddings"])
            w.add_embedding_length(h["hidden_size"])
            w.add_block_count(self.block_count)
            w.add_feed_forward_length(h["intermediate_size"])
            w.add_rope_dimension_count(int(h["rotary_pct"] * (h["hidden_size"] // h["num_attention_heads"])))
            w.add_head_count(h["num_attention_heads"])
            w.add_parallel_residual(h.get("use_parallel_residual", True))
            w.add_layer_norm_eps(h["layer_norm_eps"])
            base = h.get("rotary_emb_base", h.get("rope_theta"))
            if not self.strict and base is not None and float(base) != 10000.0:
                w.add_rope_freq_base(base)  # D4: llama.cpp reads gptneox.rope.freq_base, default 10000

    def write(self, out: Path):
        self.add_tensors()
        self.general()
        self.model_params()
        self.w.add_quantization_version(gguf.GGML_QUANT_VERSION)  # C@L927-928
        add_vocab(self.w, self.tokenizer_dir, self.model_arch, self.strict, self.hparams)
        write_atomically(self.w, out, with_tensors=True)


# --------------------------------------------------------------------------- tokenizers

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _content(entry):
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


def llama_hf_vocab(tdir: Path, strict: bool):
    """gguf-py vocab.py LlamaHfVocab (via C@L1733-1753 _set_vocab_llama_hf) without transformers:
    tokens of tokenizer.json's model.vocab by id, then added tokens past it; token_type BYTE for
    <0xNN>, CONTROL for the tokenizer's special tokens, NORMAL otherwise (USER_DEFINED for added
    non-special tokens). Scores: -1000.0 each with strict, else merge-order scores (D2)."""
    with open(tdir / "tokenizer.json", encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    if model["type"] != "BPE" or not model.get("byte_fallback", False) or (tj.get("decoder") or {}).get("type") != "Sequence":
        return None  # LlamaHfVocab raises FileNotFoundError; the converter falls back to _set_vocab_gpt2
    vocab: dict[str, int] = model["vocab"]
    base = len(vocab)
    id_to_tok = {i: t for t, i in vocab.items()}
    if sorted(id_to_tok) != list(range(base)):
        raise ConvertError("tokenizer.json: model.vocab ids are not 0..n-1")
    added = sorted((a for a in tj.get("added_tokens", []) if a["id"] >= base), key=lambda a: a["id"])
    content_to_id = dict(vocab)
    content_to_id.update({a["content"]: a["id"] for a in tj.get("added_tokens", [])})
    cfg = {}
    for fname in ("special_tokens_map.json", "tokenizer_config.json"):  # transformers merges both
        p = tdir / fname
        if p.is_file():
            with open(p, encoding="utf-8") as f:
                cfg.update({k: v for k, v in json.load(f).items() if k in SPECIAL_KEYS or k == "additional_special_tokens"})
    special_ids = set()
    for k in SPECIAL_KEYS:
        c = _content(cfg.get(k))
        if c is not None and c in content_to_id:
            special_ids.add(content_to_id[c])
    for e in cfg.get("additional_special_tokens", []) or []:
        c = _content(e)
        if c is not None and c in content_to_id:
            special_ids.add(content_to_id[c])

    if strict:
        scores_by_id = {}
        default_score = -1000.0
    else:
        # D2: score = -(rank of the first merge producing the token); everything else below
        merges = model.get("merges", [])
        scores_by_id = {}
        for rank, m in enumerate(merges):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            tid = vocab.get(a + b)
            if tid is not None and tid not in scores_by_id:
                scores_by_id[tid] = -float(rank)
        default_score = -float(len(merges))

    tokens, scores, types = [], [], []
    for i in range(base):
        text = id_to_tok[i]
        tokens.append(text.encode("utf-8"))
        scores.append(scores_by_id.get(i, default_score))
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types.append(gguf.TokenType.BYTE)
        elif i in special_ids:
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.NORMAL)
    for a in added:
        if a["id"] != len(tokens):
            raise ConvertError("tokenizer.json: added token ids are not contiguous")
        tokens.append(a["content"].encode("utf-8"))
        scores.append(-1000.0)
        types.append(gguf.TokenType.CONTROL if a["id"] in special_ids else gguf.TokenType.USER_DEFINED)
    return tokens, scores, types


def add_vocab(w: gguf.GGUFWriter, tdir: Path, model_arch, strict: bool, hparams: dict | None):
    has_tj = (tdir / "tokenizer.json").is_file()
    has_bpe_files = (tdir / "vocab.json").is_file() and (tdir / "merges.txt").is_file()
    if (tdir / "tokenizer.model").is_file() or (has_tj and model_arch in (gguf.MODEL_ARCH.GEMMA, gguf.MODEL_ARCH.GEMMA2)):
        raise ConvertError(f"{tdir}: this needs the SentencePiece path (_set_vocab_sentencepiece, C@L1631-1641), "
                           "not available without the sentencepiece package")
    v = llama_hf_vocab(tdir, strict) if has_tj else None
    if has_tj and v is None and not has_bpe_files:
        raise ConvertError(f"{tdir}/tokenizer.json is not a Llama-style byte-fallback BPE; the converter's GPT-2 path "
                           "needs transformers' AutoTokenizer and its pre-tokenizer hash table (C@L1274)")
    if v is not None:
        # C@L1733-1753: _set_vocab_llama_hf. (That is LlamaModel's path, C@L2830-2837; for qwen2/qwen3/gemma3
        # the converter would take the GPT-2 path instead, which needs transformers: the Llama-style
        # vocabulary is written for them too.)
        tokens, scores, types = v
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        gguf.SpecialVocab(tdir, n_vocab=len(tokens)).add_to_gguf(w)
        # C@L2851-2856 (LlamaModel.set_vocab): add_space_prefix only when tokenizer_config has add_prefix_space
        tc = tdir / "tokenizer_config.json"
        if model_arch == gguf.MODEL_ARCH.LLAMA and tc.is_file():
            with open(tc, encoding="utf-8") as f:
                tcj = json.load(f)
            if "add_prefix_space" in tcj:
                w.add_add_space_prefix(tcj["add_prefix_space"])
    elif has_bpe_files:
        # C@L1567-1575 _set_vocab_gpt2 + C@L1226-1271 get_vocab_base, for GPT-2's vocab.json + merges.txt
        with open(tdir / "vocab.json", encoding="utf-8") as f:
            vocab: dict[str, int] = json.load(f)
        n = (hparams or {}).get("vocab_size", len(vocab))
        if max(vocab.values()) >= n:  # the converter's assert (C@L1233)
            raise ConvertError(f"{tdir}/vocab.json has ids up to {max(vocab.values())}, config.json vocab_size is {n}")
        id_to_tok = {i: t for t, i in vocab.items()}
        tokens, types = [], []
        for i in range(n):
            if i not in id_to_tok:
                tokens.append(f"[PAD{i}]")
                types.append(gguf.TokenType.UNUSED)
            else:
                t = id_to_tok[i]
                tokens.append(t)
                # HF's GPT-2 tokenizer registers <|endoftext|> as a special added token -> CONTROL
                types.append(gguf.TokenType.CONTROL if (t.startswith("<|") and t.endswith("|>")) else gguf.TokenType.NORMAL)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")  # the pre-tokenizer hash of GPT-2's tokenizer (C@L1371-1373, openai-community/gpt2)
        w.add_token_list(tokens)
        w.add_token_types(types)
        sv = gguf.SpecialVocab(tdir, load_merges=True)  # merges.txt (first line "#version" skipped)
        eot = vocab.get("<|endoftext|>")
        if eot is not None:  # GPT-2's config.json: bos_token_id = eos_token_id = 50256
            sv._set_special_token("bos", eot)
            sv._set_special_token("eos", eot)
        sv.add_to_gguf(w)
    else:
        w.add_tokenizer_model("none")  # C@L1564-1565 _set_vocab_none: the fixtures have no tokenizer


def write_atomically(w: gguf.GGUFWriter, out: Path, with_tensors: bool):
    tmp = out.with_name(out.name + ".tmp")
    try:
        w.write_header_to_file(path=tmp)
        w.write_kv_data_to_file()
        if with_tensors:
            w.write_tensors_to_file(progress=False)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        try:
            w.close()
        except Exception:
            pass
        tmp.unlink(missing_ok=True)
        raise


def vocab_only(src: Path, out: Path, tokenizer_dir: Path | None, arch: str | None, strict: bool):
    """--vocab-only: general.architecture and the tokenizer keys, no tensors. (The converter's
    --vocab-only also writes the hyperparameters, C@L1193-1200 via prepare_metadata C@L895-928; a tokenizer folder has none.)"""
    tdir = tokenizer_dir or src
    hparams = None
    if (src / "config.json").is_file():
        with open(src / "config.json", encoding="utf-8") as f:
            hparams = json.load(f)
    if arch is None and hparams and (hparams.get("architectures") or [None])[0] in ARCH_OF:
        arch = gguf.MODEL_ARCH_NAMES[ARCH_OF[hparams["architectures"][0]]]
    if arch is None:
        arch = "gpt2" if (tdir / "vocab.json").is_file() else "llama"
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    w = gguf.GGUFWriter(path=None, arch=arch)
    add_vocab(w, tdir, model_arch, strict, hparams)
    write_atomically(w, out, with_tensors=False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="Hugging Face folder: config.json + model*.safetensors (or a tokenizer folder with --vocab-only)")
    ap.add_argument("out", type=Path, help="output .gguf (written as OUT.tmp, then renamed)")
    ap.add_argument("--outtype", choices=sorted(FTYPE), default="f16")
    ap.add_argument("--tokenizer", type=Path, help="take the tokenizer from this folder instead of SRC")
    ap.add_argument("--vocab-only", action="store_true", help="general.architecture + tokenizer keys only, no tensors")
    ap.add_argument("--arch", help="GGUF architecture name for --vocab-only without config.json (default: gpt2 for vocab.json+merges.txt, else llama)")
    ap.add_argument("--strict-converter", action="store_true", help="exactly what convert_hf_to_gguf.py writes (no deviations D1-D4)")
    ap.add_argument("-v", "--verbose", action="store_true", help="show gguf-py's warnings (duplicated keys, template parsing)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR, format="%(name)s: %(message)s")
    try:
        if args.vocab_only:
            vocab_only(args.src, args.out, args.tokenizer, args.arch, args.strict_converter)
        else:
            Converter(args.src, args.outtype, args.strict_converter, args.tokenizer).write(args.out)
    except (ConvertError, OSError, KeyError, ValueError) as e:
        print(f"make_gguf.py: {args.src}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
