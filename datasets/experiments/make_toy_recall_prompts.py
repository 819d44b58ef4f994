#!/usr/bin/env python3
"""Writes toy-recall-prompts.jsonl: associative-recall prompts for the toy recall model (standard library only).

The format of the model's evaluation rows (datasets/toy_tasks.h, recall_batch): pairs "k V" (a distinct
lowercase key, an uppercase value) with filler (digits and '.') spread between them, then "?k"; the
answer is k's value. The tokenizer maps one character to one token and prepends BOS, so a prompt of
63 characters is a 64-token row. "counterfactual" is another pair's value (or a fresh letter).

Run from the repository root: python3 datasets/experiments/make_toy_recall_prompts.py
"""
import json
import random
import string

COUNT, LENGTH, SEED = 32, 63, 5


def prompt(rng):
    n_pairs = rng.randint(2, 12)
    keys = rng.sample(string.ascii_lowercase, n_pairs)
    values = [rng.choice(string.ascii_uppercase) for _ in keys]
    body = LENGTH - 2
    gaps = [0] * (n_pairs + 1)
    for _ in range(body - 2 * n_pairs):
        gaps[rng.randint(0, n_pairs)] += 1
    text = []
    for p in range(n_pairs + 1):
        text += [rng.choice(string.digits + ".") for _ in range(gaps[p])]
        if p < n_pairs:
            text += [keys[p], values[p]]
    q = rng.randrange(n_pairs)
    others = [v for i, v in enumerate(values) if v != values[q]]
    cf = rng.choice(others) if others else rng.choice([c for c in string.ascii_uppercase if c != values[q]])
    return {"prompt": "".join(text) + "?" + keys[q], "answer": values[q], "counterfactual": cf}


def main():
    rng = random.Random(SEED)
    with open("datasets/experiments/toy-recall-prompts.jsonl", "w") as f:
        for _ in range(COUNT):
            f.write(json.dumps(prompt(rng)) + "\n")


if __name__ == "__main__":
    main()
