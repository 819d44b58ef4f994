#!/usr/bin/env python3
"""Writes small Hugging Face checkpoints for the needle-protocol equality test (tests/cli_protocol.sh).

Usage: make_tiny_hf.py OUT_DIR [--testdata ../shared/testdata] [--seed 0]

Writes OUT_DIR/qwen2-gpt2tok: a random Qwen2ForCausalLM with grouped-query attention (2 layers,
4 query heads, 2 kv heads, hidden 64, head_dim 16, MLP 128, 1024 positions, untied lm_head, q/k/v
biases as every Qwen2 has) that uses GPT-2's byte-level BPE tokenizer (vocab 50257) from
TESTDATA/gpt2-tokenizer (vocab.json + merges.txt), seeded with torch.manual_seed(SEED):
  model.safetensors (float32), config.json, generation_config.json (eos_token_id a LIST
  [50256, 13]: <|endoftext|> and "." (GPT-2 id 13), so LOCOS's stop rule (get_stop_token_ids:
  tokenizer.eos_token_id plus every generation_config id) has something to stop on in a short
  greedy decode; Wu et al.'s decode stops on the newline only and runs on past it),
  tokenizer.json (+ tokenizer_config.json) written by transformers from the tokenizers library
  and saved again as transformers 5 loads it for a qwen2 checkpoint (Qwen2Tokenizer: NFC and
  Qwen2's split regex before the byte-level step; see below), so that headscope's C++ reader,
  transformers and the reference codes tokenize alike.
Weights: transformers' own init (normal, std = initializer_range 0.2, larger than the usual 0.02 so
that greedy steps are far from ties between the two implementations' float32 rounding), norms 1;
the lm_head rows of "." and the newline scaled by STOP_ROW_SCALE so that greedy decodes stop now
and then.

The SentencePiece-style model of the test is ../shared/testdata/tinystories-656k, used as it is
(never copied). Needs the peers' venv (torch, transformers, tokenizers).
"""
import argparse
import json
import os
import sys


STOP_ROW_SCALE = 2.5


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--testdata", default=os.path.join(here, "..", "..", "shared", "testdata"))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import torch
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    gpt2 = os.path.join(a.testdata, "gpt2-tokenizer")
    vocab, merges = os.path.join(gpt2, "vocab.json"), os.path.join(gpt2, "merges.txt")
    if not (os.path.isfile(vocab) and os.path.isfile(merges)):
        sys.exit(f"make_tiny_hf.py: no GPT-2 tokenizer at {gpt2} (vocab.json, merges.txt)")

    out = os.path.join(a.out, "qwen2-gpt2tok")
    os.makedirs(out, exist_ok=True)

    # The GPT-2 tokenizer as Hugging Face's gpt2 tokenizer.json has it: byte-level pre-tokenizer
    # (no prefix space, GPT-2's regex), byte-level decoder and post-processor, <|endoftext|> an
    # added special token (BOS = EOS = UNK), no BOS added on encode.
    tk = Tokenizer(BPE.from_file(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tk.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tk.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  unk_token="<|endoftext|>", model_max_length=1024,
                                  clean_up_tokenization_spaces=False)
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 50256 and len(tok) == 50257, len(tok)
    tok.save_pretrained(out)

    cfg = Qwen2Config(vocab_size=50257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      use_sliding_window=False, bos_token_id=50256, eos_token_id=50256,
                      initializer_range=0.2, hidden_act="silu")
    torch.manual_seed(a.seed)
    model = Qwen2ForCausalLM(cfg).float().eval()
    # Rows of "." (13) and the newline "Ċ" (198) of the unembedding scaled up, so that greedy decodes
    # of this random model do say them now and then: the stop rules (Wu: the newline, appended;
    # LOCOS: newline or EOS list, before appending) get exercised, not only the 50-step cap.
    with torch.no_grad():
        model.lm_head.weight[13] *= STOP_ROW_SCALE
        model.lm_head.weight[198] *= STOP_ROW_SCALE
    model.generation_config = GenerationConfig(bos_token_id=50256, eos_token_id=[50256, 13])
    model.save_pretrained(out, safe_serialization=True)

    # transformers 5 picks the tokenizer class from config.json's model_type: a qwen2 checkpoint
    # always loads as Qwen2Tokenizer, which rebuilds the pipeline with Qwen2's own pre-tokenizer
    # (NFC, then a Split on Qwen's regex: "(?i:'s|...)|...| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|...")
    # whatever tokenizer.json says, so ".\n\n" next to text encodes as [13, 628] there and as
    # GPT-2's [13, 198, 198] from a GPT-2 tokenizer.json. Saving the tokenizer as transformers loads
    # it writes that pipeline into tokenizer.json, so that headscope (which reads the file),
    # transformers and the reference codes (AutoTokenizer) all tokenize alike: GPT-2's vocabulary
    # and merges under Qwen2's pre-tokenizer, as a real Qwen2 checkpoint's tokenizer.json has it.
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(out).save_pretrained(out)
    back = json.load(open(os.path.join(out, "tokenizer.json")))
    assert back["pre_tokenizer"]["type"] == "Sequence", back["pre_tokenizer"]

    # headscope reads rope_theta at the top level (llama_load.cpp); transformers 5 may write it
    # only under rope_parameters. Write both so that neither reader falls back to a default.
    cpath = os.path.join(out, "config.json")
    with open(cpath) as f:
        c = json.load(f)
    c["rope_theta"] = 10000.0
    c["architectures"] = ["Qwen2ForCausalLM"]
    with open(cpath, "w") as f:
        json.dump(c, f, indent=2)
    print(out)


if __name__ == "__main__":
    main()
