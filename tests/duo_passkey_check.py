#!/usr/bin/env python3
"""DuoAttention's training sample for a real tokenizer, rebuilt with the reference's lines:
mit-han-lab/duo-attention@fe93c31 duo_attn/data.py, MultiplePasskeyRetrievalDataset (l. 18-272, the
same lines as its first commit 03dca84), with the arguments duo_attn/train.py passes it (l. 324-336),
with the Hugging Face `tokenizers` library on the model's tokenizer.json (the reference's
`tokenizer.encode(text, add_special_tokens=...)`: the transformers 4.x the reference ran loads a folder
with a tokenizer.json as a Fast tokenizer, that file's pipeline) and torch's float32 linspace; compared
token for token with headscope's duo_passkey_sample (probes/ablation/duo_data.h), which
tests/test_duo_gates.cpp dumps with its draws. (transformers 5.24's AutoTokenizer gives a
LlamaTokenizer rebuilt from tokenizer_config.json that encodes differently on tinystories-656k:
" </book>.\n\n" -> [80, 23, 822, 24, 122, 3], the <unk> of '/' dropped and one '▁' fewer, where
tokenizer.json's pipeline and headscope give [80, 80, 23, 0, 822, 24, 122, 3].)

The reference draws with torch's global RNG (torch.randint in _generate_passkey l. 183-188,
torch.randperm in __getitem__ l. 196-202, RandomSampler's permutation of the items for train.py's
DataLoader(shuffle=True), l. 340-342 and data.py l. 301-313); headscope draws with std::mt19937_64. So
this script does not draw: it replays the recorded draws (the item, i.e. which context length; the
passkey word indices; the chosen depth indices) through the reference's lines and checks the draws are
of the reference's form (every epoch of n = context_lengths_num_intervals steps takes each of the n
items once, as RandomSampler's per-epoch torch.randperm(n) does; indices into the 26-word alphabet;
distinct sorted depth indices of the depth_ratio_num_intervals). Everything else must be equal: the
context lengths (torch.linspace(min, max, n, dtype=torch.int), l. 110-115), each step's length, the
trimmed haystack, every sample's input_ids and labels. Tolerance: none.

The haystack: the reference concatenates dataset samples until context_length_max tokens and cuts
the text by a decode/encode round trip (`_trim` l. 210-214); headscope repeats the one haystack file
and keeps the token prefix. This script rebuilds headscope's haystack that way and says whether the
round trip would have given the same tokens (informational).

Usage: PY tests/duo_passkey_check.py --dump DUMP.json --tokenizer MODEL_DIR --haystack FILE
  (PY: a Python with torch and tokenizers, e.g. .venv-peers/bin/python). Exit 0 equal, 1 not.
"""
import argparse
import json
import math
import sys

import torch
from tokenizers import Tokenizer

# l. 19-46 and l. 48-69
ALPHABET = ("alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike november "
            "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
ORDINALS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
            "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth").split()
# the __init__ defaults, l. 77-86
NEEDLE = "Remeber this sequence of words, it's the {ordinal_number} passkey to the vault: "
QUESTION = "Based on the content of the book, what is the {ordinal_number} passkey to the vault?\nPasskey: "
PROMPT1 = "<|im_start|> This is a very long story book: <book> "
PROMPT2 = " </book>.\n\n"
SEPARATOR = "\n\n"


def passkey_text(words):  # _generate_passkey, l. 186: " ".join of the drawn words
    return " ".join(ALPHABET[i] for i in words)


class Reference:
    """The dataset's __init__ (l. 93-180) with train.py's arguments (l. 324-336), the draws replayed."""

    def __init__(self, tok, haystack_tokens, case):
        self.tok = tok
        passkeys, buffer = case["passkeys"], case["buffer"]
        self.num_passkeys = passkeys
        self.context_length_min, self.context_length_max = case["length_min"], case["length_max"]  # l. 104-108
        self.context_length_intervals = torch.linspace(self.context_length_min, self.context_length_max,
                                                       case["length_intervals"], dtype=torch.int)  # l. 110-115
        self.depth_ratio_num_intervals = case["depth_intervals"]
        self.depth_ratio_intervals = torch.linspace(case["depth_min"], case["depth_max"], case["depth_intervals"])  # l. 117-119
        enc = lambda s, special=False: tok.encode(s, add_special_tokens=special)
        self.needle_tokens_list = [enc(NEEDLE.format(ordinal_number=o)) for o in ORDINALS[:passkeys]]  # l. 134-148
        self.retrieval_question_tokens_list = [enc(QUESTION.format(ordinal_number=o)) for o in ORDINALS[:passkeys]]
        self.haystack_tokens = list(haystack_tokens)  # l. 150-152 (headscope's haystack, see the docstring)
        self.seperator_tokens = enc(SEPARATOR)
        self.prompt1_tokens = enc(PROMPT1, True)  # l. 156: WITH the special tokens
        self.prompt2_tokens = enc(PROMPT2)
        passkey_tokens = enc(passkey_text(case["init_words"]))  # l. 159-161, the draw replayed
        needle_tokens = self.needle_tokens_list[0] + passkey_tokens
        other_input_len = (len(self.prompt1_tokens) + len(self.prompt2_tokens) +
                           (len(self.seperator_tokens) + len(needle_tokens) + len(self.seperator_tokens) +
                            len(self.retrieval_question_tokens_list[0]) + len(passkey_tokens)) * passkeys)  # l. 163-174
        if len(self.haystack_tokens) + other_input_len > self.context_length_max - buffer:  # l. 175-180
            self.haystack_tokens = self.haystack_tokens[: self.context_length_max - buffer - other_input_len]

    def __len__(self):  # l. 190-191: the DataLoader's items
        return len(self.context_length_intervals)

    def item(self, i, depth_index, words):
        """__getitem__(i) (l. 193-208) with the randperm's kept indices and the passkeys' words replayed."""
        context_length = self.context_length_intervals[i]  # l. 194
        depth_ratios = self.depth_ratio_intervals[torch.tensor(depth_index, dtype=torch.long)].sort().values
        passkey_tokens_list = [self.tok.encode(passkey_text(w), add_special_tokens=False) for w in words]
        context = self._insert_needle(context_length, depth_ratios, passkey_tokens_list)
        return self._construct_input(context, passkey_tokens_list)

    def _insert_needle(self, context_length, depth_ratios, passkey_tokens_list):  # l. 216-242
        haystack_tokens = self.haystack_tokens[:context_length]
        context, last = [], 0
        for i, (depth_ratio, passkey_tokens) in enumerate(zip(depth_ratios, passkey_tokens_list)):
            insertion_point = int(len(haystack_tokens) * depth_ratio)  # a float32 tensor product
            context += (haystack_tokens[last:insertion_point] + self.seperator_tokens +
                        self.needle_tokens_list[i] + passkey_tokens + self.seperator_tokens)
            last = insertion_point
        return context + haystack_tokens[last:]

    def _construct_input(self, context_tokens, passkey_tokens_list):  # l. 244-270
        qa_tokens = []
        for passkey_tokens, question in zip(passkey_tokens_list, self.retrieval_question_tokens_list):
            qa_tokens += question + passkey_tokens + self.seperator_tokens
        context_tokens = self.prompt1_tokens + context_tokens
        # the reference's condition as written: `%` binds to len(prompt2) only
        if len(context_tokens) + len(qa_tokens) + len(self.prompt2_tokens) % 16 != 0:
            pad_len = 16 - (len(context_tokens) + len(qa_tokens) + len(self.prompt2_tokens)) % 16
            context_tokens += self.haystack_tokens[-pad_len:]
        context_tokens += self.prompt2_tokens
        input_ids = context_tokens + qa_tokens
        assert len(input_ids) % 16 == 0
        return input_ids, [-100] * len(context_tokens) + qa_tokens


class HFTokenizer:
    """tokenizer.json through the tokenizers library, with transformers' encode/decode signature."""

    def __init__(self, folder):
        self.t = Tokenizer.from_file(folder.rstrip("/") + "/tokenizer.json")

    def encode(self, text, add_special_tokens=True):
        return self.t.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids):
        return self.t.decode(ids)


def headscope_haystack(tok, text, ctx):
    """The haystack file repeated until it has ctx tokens, the token prefix (duo_passkey_data)."""
    one = tok.encode(text, add_special_tokens=False)
    copies = math.ceil(ctx / len(one))
    tokens = tok.encode(text * copies, add_special_tokens=False)
    while len(tokens) < ctx:
        copies += 1
        tokens = tok.encode(text * copies, add_special_tokens=False)
    return tokens[:ctx], text * copies


def main():
    # The reference runs torch 2.4 (its README); torch < 2.0 vectorised linspace on the CPU and gives
    # other integer lengths and float depths (pytorch/pytorch#89048), so it cannot stand in for it.
    if int(torch.__version__.split(".")[0]) < 2:
        print(f"duo_passkey_check: needs torch >= 2.0 (the reference's linspace), this is {torch.__version__}")
        return 1
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--haystack", required=True)
    a = ap.parse_args()
    tok = HFTokenizer(a.tokenizer)
    text = open(a.haystack, encoding="utf-8").read()
    bad = 0
    for case in json.load(open(a.dump)):
        lo, hi, n, k, w = case["length_min"], case["length_max"], case["length_intervals"], case["passkeys"], case["words"]
        depths = case["depth_intervals"]
        name = (f"length {hi}" if lo == hi and n == 1 else f"lengths {lo}..{hi} in {n}") + \
            f", {k} passkeys of {w} words, depths linspace({case['depth_min']}, {case['depth_max']}, {depths})"
        hay, hay_text = headscope_haystack(tok, text, hi)
        round_trip = tok.encode(tok.decode(hay), add_special_tokens=False)  # _trim's decode/encode
        ref = Reference(tok, hay, case)
        if ref.context_length_intervals.tolist() != case["lengths"]:
            print(f"{name}: the context lengths differ: {ref.context_length_intervals.tolist()} vs {case['lengths']}")
            bad += 1
        if ref.haystack_tokens != case["haystack"]:
            print(f"{name}: the trimmed haystack differs ({len(ref.haystack_tokens)} vs {len(case['haystack'])} tokens)")
            bad += 1
        # train.py's DataLoader(shuffle=True): each epoch of len(dataset) steps a permutation of the items.
        items = [s["item"] for s in sorted(case["samples"], key=lambda s: s["step"])]
        for e in range(0, len(items), len(ref)):
            epoch = items[e:e + len(ref)]
            if len(set(epoch)) != len(epoch) or not all(0 <= i < len(ref) for i in epoch):
                print(f"{name}: steps {e}..{e + len(epoch) - 1} draw items {epoch}: not distinct items of the {len(ref)} (an epoch)")
                bad += 1
        for s in case["samples"]:
            di, words, i = s["depth_index"], s["words"], s["item"]
            if int(ref.context_length_intervals[i]) != s["context_length"]:
                print(f"{name}, step {s['step']}: item {i}'s length {int(ref.context_length_intervals[i])} vs {s['context_length']}")
                bad += 1
            if not (len(di) == k and sorted(set(di)) == di and all(0 <= j < depths for j in di)):
                print(f"{name}, step {s['step']}: depth indices {di} are not {k} distinct sorted indices of {depths}")
                bad += 1
            if not (len(words) == k and all(len(x) == w and all(0 <= j < len(ALPHABET) for j in x) for x in words)):
                print(f"{name}, step {s['step']}: the passkeys' words are not {k} x {w} alphabet indices")
                bad += 1
            ids, labels = ref.item(i, di, words)
            if ids != s["tokens"] or labels != s["labels"]:
                first = next((j for j, (x, y) in enumerate(zip(ids, s["tokens"])) if x != y), min(len(ids), len(s["tokens"])))
                print(f"{name}, step {s['step']}: differs (T {len(ids)} vs {len(s['tokens'])}; first token difference at {first}; "
                      f"labels equal: {labels == s['labels']})")
                bad += 1
            else:
                n_qa = sum(1 for x in labels if x != -100)
                print(f"{name}, step {s['step']}: equal (item {i}: context length {s['context_length']}, T {len(ids)}, "
                      f"{n_qa} labelled, depths {di[:4]}{'...' if len(di) > 4 else ''})")
        print(f"{name}: _trim's decode/encode round trip keeps the haystack's {hi} tokens: {round_trip == hay}")
    print("duo_passkey_check:", "OK" if bad == 0 else f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
