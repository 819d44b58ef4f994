#!/usr/bin/env python3
"""Independent reference harness for `headscope retrieval --protocol wu|locos`.

Builds needle-in-a-haystack trials EXACTLY as the two reference codes build them, decodes them
greedily through Hugging Face transformers, and scores every head both ways (Wu et al.'s retrieval
credit, LOCOS's logit contribution) so that tests/needle_protocol_check.py can compare headscope's
HDF5 file with this output trial by trial. Re-implemented from reading the reference code (nothing
is copied); every line that follows a reference line cites it as `file:line`:

  WU   = nightdessert/Retrieval_Head  retrieval_head_detection.py      (the scan)
  WUM  = nightdessert/Retrieval_Head  needle_in_haystack_with_mask.py  (the masked loop)
  LC   = aryopg/locos @2f162f5  locos/detectors/logit_contrib.py
  NU   = aryopg/locos  locos/utils/needle_utils.py
  DS   = aryopg/locos  locos/utils/datasets.py
  MU   = aryopg/locos  locos/utils/model_utils.py
  CT   = aryopg/locos  locos/detectors/contrastive.py
  BH   = aryopg/locos  locos/detectors/behavioral.py
  NA   = aryopg/locos  locos/analysis/nolima_ablation.py

docs/needle-protocols.md explains each choice, the substitutions for other tokenizers and what in
the references looks like a bug.

Usage:
  needle_reference.py --model DIR --protocol wu|locos --haystack-dir DIR --lengths 300,400
      --depths 0,50,100 [--max-new-tokens 50] [--ablate L0H1,L1H2 --ablation zero-query|mean-query]
      [--ablation-max-tokens 100] [--num-calibration 50] [--seed 42] [--dtype float32]
      [--threads 1] --out trials.jsonl

--haystack-dir holds the references' layout: needles.jsonl (fields needle, question, real_needle)
and part1..partK (K = number of needles; both references hard-code K = 3): wu reads every
part{i}/*.txt as raw text; locos reads part{i}/p1.plain.txt, else part{i}/p1.txt as JSON
{"rows": [{"row": {"text": ...}}, ...]} (scripts/make_reference_layout.py writes both).

Output (JSON Lines; the contract tests/needle_protocol_check.py reads):
  line 1: {"meta": {protocol, model, lengths, depths, n_layers, n_heads, n_kv_heads, period_ids,
           stop_ids, newline_ids, adds_bos, ...}}
  one line per trial, in the grid order lengths x depths x needles, trial key (length, depth, needle):
    "length", "depth", "needle"          the key (needle = 0-based index into needles.jsonl)
    "prompt": [ids]                      the whole prompt the scan decodes from
    "needle_span": [s, e]                needle tokens in the prompt, e exclusive (-1, -1: not found;
                                         wu: found by Wu's overlap search, locos: tracked)
    "answer_span": [s, e]                the retrieval credit's span (wu: find_needle_idx(real_needle),
                                         (-1, -1) = nobody gets credit; locos: BH's search, else the
                                         needle span)
    "generated": [ids]                   greedy tokens (wu: the newline stop token INCLUDED, as WU
                                         appends it before it stops; locos: stop token excluded)
    "response", "rouge1_recall", "rougeL_f", "passed"   (passed = rouge1 recall * 100 > 50)
    "answer_steps": [step indices]       CT identify_answer_steps(generated, real_needle)
    "steps": [{"token", "credit": [[L x H]], "lplus": [[L x H]] | null, "lminus": ... | null}]
                                         one per generated token (index = position in generated)
    "retrieval": [[L x H]]               sum of credit over the steps
    "lplus", "lminus", "locos": [[L x H]] | null   means over the answer steps (locos = lplus - lminus);
                                         null without answer steps or without a needle span
  with --ablate: "ablated_generated", "ablated_response", "ablated_rouge1_recall", "ablated_passed"
  locos only: "eval_prompt", "eval_generated", "eval_response", "eval_rouge1_recall", "eval_passed"
    (NA generate_for_trial's prompt and unablated decode: the ablation passes' baseline)
  last line with --ablation mean-query (locos): {"calibration_mean": [[[L x H x d]]],
    "calibration_order": [grid indices of the calibration trials, in the order they ran]}
All scores are computed in float64 from the model's float32 tensors.
"""
import argparse
import bisect
import glob
import inspect
import json
import os
import random
import re
import sys

import numpy as np
import torch

# The prompt wording both references use: WU:266, DS:164.
QUESTION_FMT = "Based on the content of the book, Question: {}\nAnswer:"
BUFFER = 200  # WU:89 final_context_length_buffer; NU:126 context_buffer


def log(msg):
    print(f"needle_reference: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Tokenizer substitutions (the references hard-code Llama-2's ids in places)
# ---------------------------------------------------------------------------------------------

def ids_with_token_strings(tok, strings):
    """Every id whose vocabulary string (convert_ids_to_tokens) is one of `strings`."""
    vocab = tok.get_vocab()
    return sorted(i for s, i in vocab.items() if s in strings)


def wu_period_ids(tok):
    # WU:420 hard-codes Llama-2's period ids [29889, 869] (model_provider "LLaMA", the default,
    # WU:522): the pieces "." and "▁.". Substituted: every id whose vocabulary string is ".",
    # "▁." (SentencePiece's word-start mark) or "Ġ." (byte-level BPE's), which is exactly
    # [29889, 869] on Llama-2's vocabulary.
    return ids_with_token_strings(tok, {".", "\u2581.", "\u0120."})


def newline_ids(tok):
    # WU:246 stops on `step_token == '<0x0A>' or inp.item() == 144`: "<0x0A>" is SentencePiece's
    # byte-fallback newline; 144 is a model-specific id the authors added (it is "<0x0A>"-like
    # for another vocabulary). Substituted: every id whose vocabulary string is "<0x0A>", plus
    # every non-special id that decodes to exactly "\n" (byte-level BPE's "Ċ", GPT-2 id 198; a
    # character-level or SentencePiece vocabulary's literal "\n" piece). EOS is NOT a stop (WU).
    special = set(tok.all_special_ids)
    out = set(ids_with_token_strings(tok, {"<0x0A>"}))
    n = len(tok)
    for i in range(n):
        if i in special:
            continue
        if tok.decode([i]) == "\n":
            out.add(i)
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# Shared reference pieces
# ---------------------------------------------------------------------------------------------

def load_needles(haystack_dir):
    # WU:119 [json.loads(l) for l in open(needles.jsonl)]; DS:102 the same over stripped lines.
    path = os.path.join(haystack_dir, "needles.jsonl")
    with open(path) as f:
        lines = [json.loads(line) for line in f.read().strip().splitlines()]
    for i, d in enumerate(lines):
        for k in ("needle", "question", "real_needle"):
            if k not in d:
                sys.exit(f"needle_reference: {path}:{i + 1}: no '{k}' (DS:104-107 needs needle, question, real_needle)")
    return lines


def find_needle_idx_wu(prompt_ids, needle_ids):
    """WU:249-259: the first window (i over the WHOLE prompt, a window may run short at the end)
    whose token SET covers > 90% of the needle's token set; (-1, -1) when none."""
    span_len = len(needle_ids)                          # WU:252
    needle_set = set(needle_ids)
    if not needle_set:
        return -1, -1                                   # WU:256 would divide by zero
    for i in range(len(prompt_ids)):                    # WU:253
        span_ids = set(prompt_ids[i:i + span_len])      # WU:254-255
        overlap = float(len(span_ids & needle_set)) / len(needle_set)  # WU:256
        if overlap > 0.9:                               # WU:257
            return i, i + span_len                      # WU:258
    return -1, -1                                       # WU:259


def find_needle_idx_locos(prompt_ids, needle_ids):
    """NU:212-234 find_needle_idx_from_tokens: like Wu's, but full windows only."""
    span_len = len(needle_ids)                          # NU:224
    needle_set = set(needle_ids)                        # NU:225
    if not needle_set:
        return -1, -1
    for i in range(len(prompt_ids) - span_len + 1):     # NU:227
        span_set = set(prompt_ids[i:i + span_len])      # NU:228-229
        if len(span_set & needle_set) / len(needle_set) > 0.9:  # NU:230-231
            return i, i + span_len                      # NU:232
    return -1, -1                                       # NU:234


def identify_answer_steps(generated, answer_text, tok):
    """CT:100-165: exact token subsequence first, then a case-insensitive match in the
    concatenation of each token decoded alone; [] when neither matches."""
    if not generated:                                   # CT:120-121
        return []
    n = len(generated)
    ans = tok.encode(answer_text, add_special_tokens=False)  # CT:126
    if ans:                                             # CT:127
        m = len(ans)
        for i in range(n - m + 1):                      # CT:129
            if generated[i:i + m] == ans:               # CT:130
                return list(range(i, i + m))            # CT:131-133
    pieces = [tok.decode([t]) for t in generated]       # CT:139 (decode's default: specials kept)
    cum, ranges = "", []
    for p in pieces:                                    # CT:143-147
        s = len(cum)
        cum += p
        ranges.append((s, len(cum)))
    start = cum.lower().find(answer_text.lower())       # CT:150-152
    if start != -1:                                     # CT:153
        end = start + len(answer_text.lower())          # CT:154
        steps = [i for i, (cs, ce) in enumerate(ranges) if ce > start and cs < end]  # CT:156-159
        if steps:                                       # CT:160
            return steps
    return []                                           # CT:165


_scorer = None


def rouge(reference, response):
    # WU:63,296 / LC:95,1320: RougeScorer(['rouge1', 'rougeL'], use_stemmer=True).score(real_needle, response)
    global _scorer
    if _scorer is None:
        from rouge_score import rouge_scorer
        _scorer = rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=True)
    s = _scorer.score(reference, response)
    return s["rouge1"].recall, s["rougeL"].fmeasure


# ---------------------------------------------------------------------------------------------
# Model access
# ---------------------------------------------------------------------------------------------

class Runner:
    def __init__(self, model_dir, dtype, threads):
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
        torch.set_num_threads(threads)
        # WU:163 and LC:1079 ask AutoTokenizer for use_fast=False (the SentencePiece/Python
        # tokenizers). transformers 5 has only the tokenizers-backed classes for these models, and
        # its AutoTokenizer REBUILDS a llama or qwen2 checkpoint's pipeline from the class instead
        # of reading tokenizer.json's (LlamaTokenizer: a Metaspace pre-tokenizer, prepend_scheme
        # "first", where tinystories-656k's file has a Prepend + Replace normalizer, so " The"
        # loses one "▁" and text after a special token gets none; Qwen2Tokenizer: Qwen2's regex).
        # Substituted: the checkpoint's tokenizer.json as written (tokenizers' own semantics, what
        # transformers 4's fast tokenizers and headscope read), with tokenizer_config.json's
        # special tokens.
        self.tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
        dt = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        # LC:1119-1125: eager attention (output_attentions needs it); CPU, float32 here.
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt, attn_implementation="eager").eval()
        cfg = self.model.config
        cfg = getattr(cfg, "text_config", cfg)
        self.L = cfg.num_hidden_layers
        self.H = cfg.num_attention_heads
        self.KV = getattr(cfg, "num_key_value_heads", None) or self.H
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.H
        self.layers = self.model.model.layers
        # LC:131-178 get_o_proj_weights: o_proj.weight [D, H*d] -> [H, d, D]; float64 here.
        self.wo = [l.self_attn.o_proj.weight.detach().double().reshape(-1, self.H, self.d).permute(1, 2, 0)
                   for l in self.layers]
        # LC:181-190 get_unembedding_matrix: lm_head.weight [V, D].
        self.wu = self.model.lm_head.weight.detach()
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self.hooks = []

    def forward(self, ids, cache=None, attentions=False):
        kw = {"input_ids": ids, "use_cache": True, "return_dict": True}
        if attentions:
            kw["output_attentions"] = True
        if cache is not None:
            kw[self._cache_kw] = cache
        with torch.inference_mode():
            out = self.model(**kw)
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = out.past_key_values
        return out, cache

    def values(self, cache, layer):
        # LC:814-822: the layer's V cache, [kv_heads, cache_len, d].
        if hasattr(cache, "layers"):
            return cache.layers[layer].values[0]
        return cache[layer][1][0]

    # --- q_proj hooks (NA:198-249 make_zero_hook / make_mean_hook; NA:265-379 calibration) ---

    def install_q_hooks(self, heads, mode, mean=None, gate=None):
        """Replace the q_proj output (pre-RoPE) of `heads` [(l, h)]: zero (mode "zero") or the
        calibration mean (mode "mean"). `gate`: a dict whose ["on"] must be True for the hook to act
        (Wu's decode-only ablation); None = every forward (LOCOS)."""
        H, d = self.H, self.d
        by_layer = {}
        for l, h in heads:                              # NA:185-190 group_heads_by_layer
            by_layer.setdefault(l, []).append(h)
        for l, hs in by_layer.items():
            def hook(module, args, output, hs=hs, l=l):
                if gate is not None and not gate["on"]:
                    return None
                shape = output.shape
                out = output.view(shape[0], shape[1], H, d)   # NA:208-209 / 243-244
                if mode == "zero":
                    out[:, :, hs, :] = 0.0                     # NA:210
                else:
                    for h in hs:                               # NA:245-246
                        out[:, :, h, :] = mean[l][h]
                return out.view(shape)                         # NA:211 / 247
            self.hooks.append(self.layers[l].self_attn.q_proj.register_forward_hook(hook))

    def remove_hooks(self):
        for h in self.hooks:                                   # NA:431-435
            h.remove()
        self.hooks.clear()


def step_scores(run, out, cache, y, prompt, answer_span, needle_span, tie):
    """One decode step's per-head scores from the forward that PRODUCED token y.
    credit: WU:221-229 retrieval_calculate / BH:268-283 (argmax key of the step's attention row in
    the answer span and the prompt holding y there: 1/|span|). lplus/lminus: LC:510-592 with
    u = W_U[y] (LC:791-792), in float64."""
    L, H = run.L, run.H
    credit = np.zeros((L, H))
    a0, a1 = answer_span
    n_needle = needle_span[1] - needle_span[0] if needle_span[0] >= 0 else 0
    lplus = np.zeros((L, H)) if n_needle > 0 else None
    lminus = np.zeros((L, H)) if n_needle > 0 else None
    u = run.wu[y].double()                                     # LC:792
    g = H // run.KV
    for l in range(L):
        row = out.attentions[l][0, :, -1, :]                   # [H, K]: WU:224 [l][0][h][-1]; LC:759
        if tie == "topk":
            keys = [int(row[h].topk(1).indices[0]) for h in range(H)]  # WU:224 topk(1)
        else:
            keys = row.argmax(dim=-1).tolist()                 # BH:269 argmax
        if a0 >= 0:
            for h in range(H):
                k = keys[h]
                # A key past the prompt (an answer window cut short at its end, WU:254) would
                # index past prompt_ids at WU:226 (an IndexError there): no credit here.
                if a0 <= k < a1 and k < len(prompt) and prompt[k] == y:  # WU:226 / BH:273-276
                    credit[l, h] += 1.0 / (a1 - a0)            # WU:227 / BH:277-283
        if lplus is None:
            continue
        att = row.double()                                     # [H, K]
        K = att.shape[1]                                       # LC:545 key_len (= LC:828 effective_len here)
        V = run.values(cache, l)[:, :K, :].double()            # LC:816, 829
        V = V.repeat_interleave(g, dim=0) if g > 1 else V      # LC:552-554 (head h reads kv head h // g)
        u_proj = torch.einsum("hde,e->hd", run.wo[l], u)       # LC:571
        contrib = torch.einsum("hkd,hd->hk", V, u_proj)        # LC:575
        phi = att * contrib                                    # LC:581
        s0, s1 = needle_span
        plus = phi[:, s0:s1].sum(dim=-1)                       # LC:584
        off = phi.sum(dim=-1) - plus                           # LC:585
        minus = off * (n_needle / (K - n_needle))              # LC:546-547, 589-590
        lplus[l] = plus.numpy()
        lminus[l] = minus.numpy()
    return credit, lplus, lminus


# ---------------------------------------------------------------------------------------------
# Protocol wu (retrieval_head_detection.py)
# ---------------------------------------------------------------------------------------------

def wu_read_context_files(part_dir, max_context_length):
    # WU:450-458: every *.txt of the part, raw text, in glob order (unsorted: the file system's
    # order), appended whole until the WORD count reaches the largest context length.
    # (WUM:489-497 counts tokens instead; the trimmed prefix is the same whenever both reach it.)
    files = glob.glob(f"{part_dir}/*.txt")                     # WU:455
    if not files:
        sys.exit(f"needle_reference: no *.txt in {part_dir} (WU:455 would loop forever)")
    context = ""                                               # WU:451
    while len(context.split()) < max_context_length:           # WU:454
        for file in files:                                     # WU:455
            with open(file, "r") as f:                         # WU:456
                context += f.read()                            # WU:457
    return context


def wu_build(tok, context, needle, question, context_length, depth_percent, period_ids):
    # WU:478-482 encode_and_trim: encode WITH special tokens; when longer than the context length,
    # DECODE the first context_length ids (decode's default skip_special_tokens=False: a BOS comes
    # back as its text and is re-encoded below as an id).
    tokens = tok.encode(context)                               # WU:479 (WU:462 self.enc.encode)
    if len(tokens) > context_length:                           # WU:480
        context = tok.decode(tokens[:context_length])          # WU:481 (WU:471)
    # WU:397-437 insert_needle.
    tokens_needle = tok.encode(needle)                         # WU:398 (WITH specials)
    tokens_context = tok.encode(context)                       # WU:399
    context_length -= BUFFER                                   # WU:402
    if len(tokens_context) + len(tokens_needle) > context_length:        # WU:405
        tokens_context = tokens_context[:context_length - len(tokens_needle)]  # WU:406
    if depth_percent == 100:                                   # WU:408
        tokens_new_context = tokens_context + tokens_needle    # WU:410
    else:
        insertion_point = int(len(tokens_context) * (depth_percent / 100))  # WU:413
        tokens_new_context = tokens_context[:insertion_point]  # WU:417
        while tokens_new_context and tokens_new_context[-1] not in period_ids:  # WU:426 (ids: see wu_period_ids)
            insertion_point -= 1                               # WU:427
            tokens_new_context = tokens_context[:insertion_point]  # WU:428
        tokens_new_context += tokens_needle + tokens_context[insertion_point:]  # WU:433
    new_context = tok.decode(tokens_new_context)               # WU:436 (WU:469-471, tokens[:None])
    # WU:266 question; WU:279-280 prompt = tokenizer(context + question) WITH specials. The chat
    # branch (WU:273-277) is only for two named checkpoints and does not apply.
    q = QUESTION_FMT.format(question)
    return tok(new_context + q)["input_ids"]


def wu_decode(run, prompt, answer_span, needle_span, stop_ids, max_steps, capture, gate=None):
    """WU:235-247 decode (prefill prompt[:-1] at WU:289, then prompt[-1] fed at WU:290); each step
    appends the argmax, scores it, THEN stops on the newline. With `gate` (Wu's masked loop,
    WUM:272-286): the q hooks act at the decode steps only, never in the prefill."""
    if gate is not None:
        gate["on"] = False
    _, cache = run.forward(torch.tensor([prompt[:-1]]))      # WU:289
    if gate is not None:
        gate["on"] = True                                      # WUM:277-278 block_list at decode only
    inp = prompt[-1]                                           # WU:290 input_ids[:, -1]
    output, steps = [], []
    for _ in range(max_steps):                                 # WU:238 (decode_len 50, WU:290)
        out, cache = run.forward(torch.tensor([[inp]]), cache, attentions=capture)  # WU:239-241
        y = int(out.logits[0, -1].argmax())                    # WU:242
        output.append(y)                                       # WU:244
        if capture:                                            # WU:245 retrieval_calculate
            c, lp, lm = step_scores(run, out, cache, y, prompt, answer_span, needle_span, "topk")
            steps.append({"token": y, "credit": c, "lplus": lp, "lminus": lm})
        if y in stop_ids:                                      # WU:246 (ids: see newline_ids)
            break
        inp = y
    if gate is not None:
        gate["on"] = False
    return output, steps


# ---------------------------------------------------------------------------------------------
# Protocol locos (logit_contrib.py main, --dataset niah)
# ---------------------------------------------------------------------------------------------

def locos_haystack_texts(haystack_dir, n_parts, max_tokens):
    # DS:111-132 load_niah_haystack_texts (NU:37-72 is the same): p1.plain.txt as text, else p1.txt
    # as JSON rows joined by "\n\n"; doubled with "\n\n" while it has fewer WORDS than max_tokens.
    texts = []
    for part_idx in range(1, n_parts + 1):                     # DS:114 (range(1, 4): 3 parts)
        plain = os.path.join(haystack_dir, f"part{part_idx}", "p1.plain.txt")
        raw = os.path.join(haystack_dir, f"part{part_idx}", "p1.txt")
        if os.path.exists(plain):                              # DS:118-119
            with open(plain) as f:
                text = f.read()
        elif os.path.exists(raw):                              # DS:120-122
            with open(raw) as f:
                data = json.loads(f.read())
            text = "\n\n".join(r["row"]["text"] for r in data["rows"] if r["row"].get("text"))
        else:
            sys.exit(f"needle_reference: no p1.plain.txt or p1.txt in {haystack_dir}/part{part_idx} (DS:124)")
        if not text.split():
            sys.exit(f"needle_reference: {haystack_dir}/part{part_idx}: empty haystack (DS:128 would loop forever)")
        while len(text.split()) < max_tokens:                  # DS:128
            text += "\n\n" + text                              # DS:129
        texts.append(text)
    return texts


def tokenizer_adds_bos(tok):
    # MU:207-212
    if tok.bos_token_id is None:
        return False
    t = tok.encode("test", add_special_tokens=True)
    return bool(t) and t[0] == tok.bos_token_id


def get_stop_token_ids(tok, model):
    # MU:99-123: tokenizer.eos_token_id plus model.generation_config.eos_token_id (int or list).
    stop = set()
    if tok.eos_token_id is not None:
        stop.add(tok.eos_token_id)
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        eos = getattr(gen, "eos_token_id", None)
        if isinstance(eos, list):
            stop.update(eos)
        elif eos is not None:
            stop.add(eos)
    return stop


def insert_needle_tokens(context_tokens, needle_tokens, context_length, depth_percent, period_positions,
                         context_buffer=BUFFER):
    # NU:120-150
    effective_length = context_length - context_buffer         # NU:129
    if len(context_tokens) + len(needle_tokens) > effective_length:  # NU:131
        context_tokens = context_tokens[:effective_length - len(needle_tokens)]  # NU:132
    if depth_percent == 100:                                   # NU:134
        s = len(context_tokens)                                # NU:135-138
        return context_tokens + needle_tokens, s, s + len(needle_tokens)
    insertion_point = int(len(context_tokens) * (depth_percent / 100))  # NU:140
    if period_positions:                                       # NU:141
        valid_count = bisect.bisect_right(period_positions, len(context_tokens) - 1)  # NU:142
        valid = period_positions[:valid_count]                 # NU:143
        b = bisect.bisect_right(valid, insertion_point - 1) - 1  # NU:144
        insertion_point = valid[b] + 1 if b >= 0 else 0        # NU:145
    s, e = insertion_point, insertion_point + len(needle_tokens)  # NU:147-148
    return context_tokens[:insertion_point] + needle_tokens + context_tokens[insertion_point:], s, e  # NU:149-150


def locos_period_tokens(tok):
    # NU:80-107 get_period_tokens with use_hardcoded False (LC:929 default) -> NU:107
    # set(tokenizer.encode(".", add_special_tokens=False)). NB: on a tokenizer whose normalizer
    # prepends "▁" this set holds the lone "▁" piece as well (tinystories-656k: {80, 10}).
    return set(tok.encode(".", add_special_tokens=False))


def locos_build(tok, haystack_tokens, period_positions, needle, question, context_length, depth_percent, add_bos):
    # LC:1239-1271 with NU:267-409 build_tracked_prompt (no template, no chat template LC:947,
    # no prompt suffix LC:954; answer_tokens None).
    needle_tokens = tok.encode(needle, add_special_tokens=False)         # LC:1248
    question_tokens = tok.encode(QUESTION_FMT.format(question), add_special_tokens=False)  # LC:1256, DS:164
    ctx, s, e = insert_needle_tokens(haystack_tokens, needle_tokens, context_length, depth_percent,
                                     period_positions)                   # NU:328-335
    tokens = ctx + question_tokens                                        # NU:353
    off = 0
    if add_bos:                                                           # NU:377-380
        tokens = [tok.bos_token_id] + tokens
        off = 1
    s, e = s + off, s + off + len(needle_tokens)                          # NU:398-399
    assert tokens[s:e] == needle_tokens                                   # NU:403
    return tokens, (s, e)


def locos_decode(run, prompt, answer_span, needle_span, newline_id, stop_ids, max_steps, capture):
    """LC:664-765 (BH:159-288 for the credit): prefill prompt[:-1], feed prompt[-1]; each step: the
    argmax; stop BEFORE appending on "<0x0A>", the newline id or a stop id; else append and score;
    at most max_steps content steps."""
    _, cache = run.forward(torch.tensor([prompt[:-1]]))      # LC:673-678
    cur = prompt[-1]                                           # LC:700
    generated, steps = [], []
    for _ in range(max_steps):                                 # LC:716 (max_thinking_tokens 0)
        out, cache = run.forward(torch.tensor([[cur]]), cache, attentions=capture)  # LC:717-723
        y = int(out.logits[0, -1].argmax())                    # LC:726
        if run.tok.convert_ids_to_tokens(y) == "<0x0A>" or y == newline_id:  # LC:748-750
            break
        if stop_ids and y in stop_ids:                         # LC:751-752
            break
        generated.append(y)                                    # LC:755
        if capture:                                            # LC:759-760 (attention kept); BH:262-283
            c, lp, lm = step_scores(run, out, cache, y, prompt, answer_span, needle_span, "argmax")
            steps.append({"token": y, "credit": c, "lplus": lp, "lminus": lm})
        if len(generated) >= max_steps:                        # LC:762-763
            break
        cur = y                                                # LC:765
    return generated, steps


def locos_eval_prompt(tok, haystack_text, needle, question, context_length, depth_percent, cap=None):
    """NA:520-548 generate_for_trial's prompt (and NA:338-356 calibration's when cap is set):
    NU:153-195 insert_needle (periods: NU:107, no hard-coded ids since model_name is ""), the
    context decoded WITHOUT specials, "\\n\\n" + question, encoded WITHOUT specials."""
    L = min(context_length, cap) if cap else context_length   # NA:341
    needle_tokens = tok.encode(needle, add_special_tokens=False)          # NU:184
    context_tokens = tok.encode(haystack_text, add_special_tokens=False)  # NU:185
    periods = locos_period_tokens(tok)                                    # NU:186
    positions = [i for i, t in enumerate(context_tokens) if t in periods]  # NU:110-112, 187
    ctx, _, _ = insert_needle_tokens(context_tokens, needle_tokens, L, depth_percent, positions)  # NU:188-195
    context_text = tok.decode(ctx, skip_special_tokens=True)             # NA:530 / NA:345
    prompt_text = f"{context_text}\n\n{QUESTION_FMT.format(question)}"   # NA:537 / NA:350
    if cap is None and getattr(tok, "chat_template", None):              # NA:541-546 (not in calibration: NA:352)
        kw = dict(tokenize=False, add_generation_prompt=True)
        if "enable_thinking" in tok.chat_template:
            kw["enable_thinking"] = False
        prompt_text = tok.apply_chat_template([{"role": "user", "content": prompt_text}], **kw)
    ids = tok.encode(prompt_text, add_special_tokens=False)              # NA:548 / NA:353
    if cap is not None and len(ids) > cap:                                # NA:355-356
        ids = ids[:cap]
    return ids


def locos_generate(run, prompt, newline_id, stop_ids, max_tokens):
    """NA:552-610: prefill prompt[:-1], feed prompt[-1]; stop before appending on "<0x0A>", the
    newline id or a stop id; max_tokens steps at most."""
    _, cache = run.forward(torch.tensor([prompt[:-1]]))      # NA:559-564
    cur = prompt[-1]                                           # NA:584
    out_ids = []
    for _ in range(max_tokens):                                # NA:589
        out, cache = run.forward(torch.tensor([[cur]]), cache)  # NA:590-597
        y = int(out.logits[0, -1].argmax())                    # NA:598
        if run.tok.convert_ids_to_tokens(y) == "<0x0A>" or y == newline_id:  # NA:601-603
            break
        if stop_ids and y in stop_ids:                         # NA:604-605
            break
        out_ids.append(y)                                      # NA:607
        cur = y                                                # NA:608
    return out_ids


def calibrate_mean(run, trials, num_calibration, seed, cap=5000):
    """NA:265-379 calibrate_mean_activations: the trial list shuffled by random.Random(seed), the
    first num_calibration, one forward each over NA's prompt capped at 5000 tokens; per forward the
    q_proj output (pre-RoPE) averaged over (batch, seq) in float32, summed in float64; mean over
    forwards, cast to float32. Returns ([L][H][d] float32 tensor list, the grid indices used)."""
    L, H, d = run.L, run.H, run.d
    sums = [torch.zeros(H, d, dtype=torch.float64) for _ in range(L)]  # NA:298-300
    counts = [0] * L                                                    # NA:301
    handles = []
    for l, layer in enumerate(run.layers):                              # NA:305-319
        def hook(module, args, output, l=l):
            out = output.detach().view(output.shape[0], output.shape[1], H, d)  # NA:310
            sums[l] += out.float().mean(dim=(0, 1)).cpu()                # NA:312
            counts[l] += 1                                               # NA:313
            return None
        handles.append(layer.self_attn.q_proj.register_forward_hook(hook))
    order = list(range(len(trials)))
    random.Random(seed).shuffle(order)                                  # NA:322-324 (same permutation as shuffling the trials)
    order = order[:num_calibration]                                     # NA:325
    try:
        for i in order:                                                 # NA:337
            t = trials[i]
            ids = locos_eval_prompt(run.tok, t["haystack_text"], t["needle_text"], t["question"],
                                    t["length"], t["depth"], cap=cap)   # NA:338-356
            with torch.inference_mode():
                run.model(input_ids=torch.tensor([ids]), return_dict=True)  # NA:359
    finally:
        for h in handles:                                               # NA:367-368
            h.remove()
    mean = [(sums[l] / counts[l]).float() for l in range(L)]            # NA:371-374
    return mean, order


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------

def parse_heads(spec, L, H):
    heads = []
    for part in spec.split(","):
        m = re.fullmatch(r"L(\d+)H(\d+)", part.strip())
        if not m:
            sys.exit(f"needle_reference: --ablate: '{part}' is not LlHh (e.g. L0H1)")
        l, h = int(m.group(1)), int(m.group(2))
        if l >= L or h >= H:
            sys.exit(f"needle_reference: --ablate: {part} is outside the model ({L} layers x {H} heads)")
        heads.append((l, h))
    return heads


def num_list(s, conv):
    try:
        return [conv(x) for x in s.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"needle_reference: '{s}' is not a comma-separated list of numbers")


def depth_value(x):
    v = float(x)
    return int(v) if v.is_integer() else v


def mat(a):
    return None if a is None else np.asarray(a, dtype=np.float64).tolist()


def finish_trial(rec, run, steps, real_needle, has_needle_span):
    """The per-trial aggregates: retrieval = sum of credit; lplus/lminus/locos = means over the
    answer steps (LC:798-861: per-step L+/L- summed in float64 and divided by their number)."""
    L, H = run.L, run.H
    gen = rec["generated"]
    ans = identify_answer_steps(gen, real_needle, run.tok)     # LC:771 (CT:100)
    rec["answer_steps"] = ans
    rec["retrieval"] = mat(sum((s["credit"] for s in steps), np.zeros((L, H))))
    if ans and has_needle_span:                                # LC:773-782: none -> no score
        lp = sum(steps[t]["lplus"] for t in ans) / len(ans)    # LC:795-860
        lm = sum(steps[t]["lminus"] for t in ans) / len(ans)
        rec["lplus"], rec["lminus"], rec["locos"] = mat(lp), mat(lm), mat(lp - lm)  # LC:861
    else:
        rec["lplus"] = rec["lminus"] = rec["locos"] = None
    rec["steps"] = [{"token": s["token"], "credit": mat(s["credit"]), "lplus": mat(s["lplus"]),
                     "lminus": mat(s["lminus"])} for s in steps]


def main():
    ap = argparse.ArgumentParser(description="Independent reference harness for headscope retrieval --protocol "
                                             "(see the module docstring for the output contract).")
    ap.add_argument("--model", required=True)
    ap.add_argument("--protocol", required=True, choices=["wu", "locos"])
    ap.add_argument("--haystack-dir", required=True)
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--depths", default="0,50,100")
    ap.add_argument("--max-new-tokens", type=int, default=50, help="WU:290 decode_len 50; LC:905 --max-decode-steps 50")
    ap.add_argument("--ablate", default=None)
    ap.add_argument("--ablation", default="zero-query", choices=["zero-query", "mean-query"])
    ap.add_argument("--ablation-max-tokens", type=int, default=100, help="NA:783 --max-tokens 100 (locos)")
    ap.add_argument("--num-calibration", type=int, default=50, help="NA:778 --num-calibration 50")
    ap.add_argument("--seed", type=int, default=42, help="NA's --seed 42 (calibration shuffle)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"],
                    help="float32 (the comparison); float64 measures float32 rounding's own share of a difference")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    lengths = num_list(a.lengths, int)
    depths = num_list(a.depths, depth_value)
    if not lengths or not depths:
        sys.exit("needle_reference: --lengths and --depths need at least one value")
    for dp in depths:
        if not 0 <= dp <= 100:
            sys.exit(f"needle_reference: --depths: {dp} is outside [0, 100]")
    if a.protocol == "wu" and a.ablate and a.ablation != "zero-query":
        sys.exit("needle_reference: --protocol wu: Wu et al.'s masked loop only zeroes the query (WUM:554-557); "
                 "use --ablation zero-query")

    run = Runner(a.model, a.dtype, a.threads)
    tok = run.tok
    needles = load_needles(a.haystack_dir)
    if len(needles) != 3:
        log(f"{len(needles)} needles: both references hard-code 3 (WU:121 part1-3, DS:114/157); using part1..part{len(needles)}")
    heads = parse_heads(a.ablate, run.L, run.H) if a.ablate else []

    nl_ids = newline_ids(tok)
    meta = {"protocol": a.protocol, "model": os.path.abspath(a.model), "lengths": lengths, "depths": depths,
            "n_needles": len(needles), "n_layers": run.L, "n_heads": run.H, "n_kv_heads": run.KV,
            "head_dim": run.d, "max_new_tokens": a.max_new_tokens, "ablate": a.ablate,
            "ablation": a.ablation if a.ablate else None, "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id}
    trials = []  # grid order: lengths x depths x needles (DS:160-162; WU:496-504 runs needle-major,
    #              which changes only the order, never a trial)

    if a.protocol == "wu":
        period_ids = set(wu_period_ids(tok))
        stop_ids = set(nl_ids)
        meta.update(period_ids=sorted(period_ids), stop_ids=sorted(stop_ids), newline_ids=nl_ids)
        max_len = max(lengths)                                  # WU:452
        contexts = [wu_read_context_files(os.path.join(a.haystack_dir, f"part{i + 1}"), max_len)  # WU:121, 499
                    for i in range(len(needles))]
        for L_ in lengths:
            for dp in depths:
                for ni, nd in enumerate(needles):
                    prompt = wu_build(tok, contexts[ni], nd["needle"], nd["question"], L_, dp, period_ids)
                    ans_span = find_needle_idx_wu(prompt, tok(nd["real_needle"], add_special_tokens=False)["input_ids"])  # WU:287, 250
                    # headscope's extension for LOCOS on wu trials: the needle span by the same search.
                    ndl_span = find_needle_idx_wu(prompt, tok(nd["needle"], add_special_tokens=False)["input_ids"])
                    trials.append({"length": L_, "depth": dp, "needle": ni, "prompt": prompt,
                                   "needle_span": list(ndl_span), "answer_span": list(ans_span), "nd": nd})
    else:
        add_bos = tokenizer_adds_bos(tok)                       # LC:1081
        newline_id = tok.encode("\n", add_special_tokens=False)[-1]  # LC:1080
        stop_ids = get_stop_token_ids(tok, run.model)           # LC:1162
        periods = locos_period_tokens(tok)                      # LC:1106-1111
        meta.update(period_ids=sorted(periods), stop_ids=sorted(stop_ids), newline_ids=[newline_id],
                    adds_bos=add_bos)
        texts = locos_haystack_texts(a.haystack_dir, len(needles), max(lengths))  # LC:1015-1020 (max_tokens = --max-length)
        hay = []
        for t in texts:
            ids = tok.encode(t, add_special_tokens=False)       # LC:1241
            hay.append((ids, [i for i, x in enumerate(ids) if x in periods]))  # LC:1243-1245
        for L_ in lengths:                                      # DS:160-162
            for dp in depths:
                for ni, nd in enumerate(needles):
                    prompt, ndl_span = locos_build(tok, hay[ni][0], hay[ni][1], nd["needle"], nd["question"],
                                                   L_, dp, add_bos)
                    # BH:751-757: the answer (real_needle) span by the overlap search, else the needle span.
                    fs, fe = find_needle_idx_locos(prompt, tok.encode(nd["real_needle"], add_special_tokens=False))
                    ans_span = (fs, fe) if fs != -1 else ndl_span
                    trials.append({"length": L_, "depth": dp, "needle": ni, "prompt": prompt,
                                   "needle_span": list(ndl_span), "answer_span": list(ans_span), "nd": nd,
                                   "haystack_text": texts[ni], "needle_text": nd["needle"],
                                   "question": nd["question"]})

    calibration = None
    if a.protocol == "locos" and heads and a.ablation == "mean-query":
        n_cal = min(a.num_calibration, len(trials))
        log(f"calibrating the mean queries on {n_cal} trials (seed {a.seed})")
        mean, order = calibrate_mean(run, trials, n_cal, a.seed)
        calibration = {"calibration_mean": [m.double().tolist() for m in mean], "calibration_order": order}

    tmp = a.out + ".tmp"
    found = 0
    with open(tmp, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for k, t in enumerate(trials):
            nd = t["nd"]
            prompt = t["prompt"]
            ns, asp = tuple(t["needle_span"]), tuple(t["answer_span"])
            if asp[0] >= 0:
                found += 1
            if a.protocol == "wu":
                gen, steps = wu_decode(run, prompt, asp, ns, stop_ids, a.max_new_tokens, True)
            else:
                gen, steps = locos_decode(run, prompt, asp, ns, newline_id, stop_ids, a.max_new_tokens, True)
            response = tok.decode(gen, skip_special_tokens=True).strip()  # WU:291 / LC:767
            r1, rl = rouge(nd["real_needle"], response)                   # WU:296 / LC:1320
            rec = {"length": t["length"], "depth": t["depth"], "needle": t["needle"], "prompt": prompt,
                   "needle_span": t["needle_span"], "answer_span": t["answer_span"], "generated": gen,
                   "response": response, "rouge1_recall": r1, "rougeL_f": rl,
                   "passed": bool(r1 * 100 > 50)}                        # WU:298 / LC:913, 1335
            finish_trial(rec, run, steps, nd["real_needle"], ns[0] >= 0)
            if a.protocol == "locos":
                # NA:501-610 on the unablated model: the ablation passes' baseline prompt and decode.
                ep = locos_eval_prompt(tok, t["haystack_text"], nd["needle"], nd["question"], t["length"], t["depth"])
                eg = locos_generate(run, ep, newline_id, stop_ids, a.ablation_max_tokens)
                er = tok.decode(eg, skip_special_tokens=True).strip()     # NA:610
                e1, _ = rouge(nd["real_needle"], er)                      # NA:636-639
                rec.update(eval_prompt=ep, eval_generated=eg, eval_response=er, eval_rouge1_recall=e1,
                           eval_passed=bool(e1 > 0.5))                    # NA:1070 (r > 0.5)
            if heads:
                if a.protocol == "wu":
                    gate = {"on": False}
                    run.install_q_hooks(heads, "zero", gate=gate)         # WUM:554-557 (see zero_equivalence below)
                    try:
                        ag, _ = wu_decode(run, prompt, asp, ns, stop_ids, a.max_new_tokens, False, gate=gate)
                    finally:
                        run.remove_hooks()
                else:
                    mode = "zero" if a.ablation == "zero-query" else "mean"
                    run.install_q_hooks(heads, mode, mean=mean if mode == "mean" else None)  # NA:1039-1044
                    try:
                        ag = locos_generate(run, rec["eval_prompt"], newline_id, stop_ids, a.ablation_max_tokens)
                    finally:
                        run.remove_hooks()                                # NA:1061-1063
                ar = tok.decode(ag, skip_special_tokens=True).strip()
                a1, _ = rouge(nd["real_needle"], ar)
                rec.update(ablated_generated=ag, ablated_response=ar, ablated_rouge1_recall=a1,
                           ablated_passed=bool(a1 * 100 > 50))
            f.write(json.dumps(rec) + "\n")
            log(f"trial {k + 1}/{len(trials)} (length {t['length']}, depth {t['depth']}, needle {t['needle']}): "
                f"{len(prompt)} prompt tokens, {len(gen)} generated, answer span {t['answer_span']}, "
                f"rouge1 recall {r1:.3f}")
        if calibration is not None:
            f.write(json.dumps(calibration) + "\n")
    os.replace(tmp, a.out)
    if a.protocol == "wu":
        print(f"needle_reference: wu: {found} of {len(trials)} trials found their answer span "
              f"(find_needle_idx(real_needle), WU:287)")
    print(f"needle_reference: wrote {len(trials)} trials to {a.out}")


# zero_equivalence: Wu's masked loop zeroes the query AFTER RoPE (faiss_attn/source/
# modeling_llama.py:554-557) and LOCOS zeroes q_proj's output BEFORE it (NA:198-213). A rotation
# of zero is zero, and a per-head q norm (Qwen3, Gemma 3) maps zero to zero, so the hook on q_proj's
# output gives Wu's query exactly for every family here except OLMo-2, whose q norm spans all heads.

if __name__ == "__main__":
    main()
