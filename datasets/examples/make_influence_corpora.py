#!/usr/bin/env python3
"""Writes the example corpora of `headscope influence` (standard library only).

- influence-corpus.jsonl: TinyStories-style text (pairs of sentences from datasets/needles/
  tinystories_haystack.txt and datasets/examples/story.txt), then 8 samples whose second half
  repeats the first (copying from context).
- toy-recall-influence.jsonl: for the toy recall model (datasets/toy_tasks.h): 16 recall rows with
  their answer ("...k V ... ?k V": the last token needs the key's value from the context) and 16
  rows of the same kind with no query (filler to the end: nothing to retrieve). The ground truth a
  ranking should find: masking the recall heads raises the loss of the first kind.

Run from the repository root: python3 datasets/examples/make_influence_corpora.py
"""
import json
import os
import random
import re
import string
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
import make_toy_recall_prompts  # noqa: E402  (the recall rows' one generator)

SEED, EACH = 7, 16


def stories():
    text = open("datasets/needles/tinystories_haystack.txt").read() + "\n" + open("datasets/examples/story.txt").read()
    sents = [s.strip() for s in re.split(r'(?<=[.!?"])\s+', text) if len(s.strip()) > 20]
    out = [sents[i] + " " + sents[i + 1] for i in range(0, 48, 2) if i + 1 < len(sents)]
    out += [sents[i] + " " + sents[i] for i in range(1, 41, 5)]
    return [{"text": t} for t in out]


def recall_row(rng, query):
    """A toy recall row (make_toy_recall_prompts.prompt: 63 characters ending "?k"), then k's value (the
    answer) - or, without a query, that "?k" and the answer replaced by filler."""
    p = make_toy_recall_prompts.prompt(rng)
    if query:
        return p["prompt"] + p["answer"]
    return p["prompt"][:-2] + "".join(rng.choice(string.digits + ".") for _ in range(3))


def main():
    with open("datasets/examples/influence-corpus.jsonl", "w") as f:
        for o in stories():
            f.write(json.dumps(o) + "\n")
    rng = random.Random(SEED)
    with open("datasets/examples/toy-recall-influence.jsonl", "w") as f:
        for i in range(2 * EACH):
            f.write(json.dumps({"text": recall_row(rng, i % 2 == 0)}) + "\n")


if __name__ == "__main__":
    main()
