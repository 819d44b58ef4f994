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
import random
import re
import string

LENGTH, SEED, EACH = 63, 7, 16


def stories():
    text = open("datasets/needles/tinystories_haystack.txt").read() + "\n" + open("datasets/examples/story.txt").read()
    sents = [s.strip() for s in re.split(r'(?<=[.!?"])\s+', text) if len(s.strip()) > 20]
    out = [sents[i] + " " + sents[i + 1] for i in range(0, 48, 2) if i + 1 < len(sents)]
    out += [sents[i] + " " + sents[i] for i in range(1, 41, 5)]
    return [{"text": t} for t in out]


def recall_row(rng, query):
    n_pairs = rng.randint(2, 12)
    keys = rng.sample(string.ascii_lowercase, n_pairs)
    values = [rng.choice(string.ascii_uppercase) for _ in keys]
    body = LENGTH - 3  # room for "?k" and the answer
    gaps = [0] * (n_pairs + 1)
    for _ in range(body - 2 * n_pairs):
        gaps[rng.randint(0, n_pairs)] += 1
    text = []
    for p in range(n_pairs + 1):
        text += [rng.choice(string.digits + ".") for _ in range(gaps[p])]
        if p < n_pairs:
            text += [keys[p], values[p]]
    if query:
        q = rng.randrange(n_pairs)
        return "".join(text) + "?" + keys[q] + values[q]
    return "".join(text) + "".join(rng.choice(string.digits + ".") for _ in range(3))


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
