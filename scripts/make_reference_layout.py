#!/usr/bin/env python3
"""Writes a needle data folder in the reference codes' layout from headscope's own needle files.

Usage: make_reference_layout.py --haystack FILE --needles FILE --out DIR
           [--style raw|json|plain] [--pick 0,1,2] [--real-needle answer,needle,first]

The layout (nightdessert/Retrieval_Head haystack_for_detect/, read by retrieval_head_detection.py
:119-123 and by aryopg/locos locos/utils/datasets.py:96-132):
  DIR/needles.jsonl   one {"needle", "question", "real_needle"} a line: headscope's needle and
                      question; real_needle as --real-needle says
  DIR/part{i}/        i = 1..K, one per picked needle (needle i-1 reads part{i}); its haystack is the
                      haystack file's non-blank lines (paragraphs) rotated by i-1, so that every
                      needle has its own haystack, as in the references' data:
     --style raw    part{i}/p1.txt, the paragraphs joined by "\\n\\n" (Wu et al. read every *.txt raw)
     --style json   part{i}/p1.txt, {"rows": [{"row_idx": k, "row": {"text": paragraph}}, ...]}, the
                    datasets-server form LOCOS parses (and Wu et al. read as raw text, JSON and all,
                    as with their own data)
     --style plain  part{i}/p1.plain.txt, the paragraphs joined by "\\n\\n" (LOCOS reads it first)
--pick: the needle lines to use (0-based, default the first 3: both references hard-code 3 parts).
--real-needle: what each picked needle's real_needle is (one mode for all, or one per picked needle):
  answer  headscope's answer field (default)
  needle  the needle sentence without its final period (like the references' own data, where
          real_needle is most of the needle: Wu et al.'s find_needle_idx then finds the needle)
  first   the needle's first word (a name the model may well say: LOCOS answer steps, a pass)
Only our own data goes in: never the reference repositories' haystack or needle files.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description="Write headscope needle data in the reference codes' layout.")
    ap.add_argument("--haystack", required=True)
    ap.add_argument("--needles", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--style", default="raw", choices=["raw", "json", "plain"])
    ap.add_argument("--pick", default="0,1,2")
    ap.add_argument("--real-needle", default="answer")
    a = ap.parse_args()

    with open(a.needles) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    try:
        pick = [int(x) for x in a.pick.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"make_reference_layout.py: --pick: '{a.pick}' is not a list of line numbers")
    for p in pick:
        if not 0 <= p < len(rows):
            sys.exit(f"make_reference_layout.py: --pick: {p} is outside {a.needles}'s {len(rows)} needles")
    modes = [m.strip() for m in a.real_needle.split(",")]
    if len(modes) == 1:
        modes = modes * len(pick)
    if len(modes) != len(pick) or any(m not in ("answer", "needle", "first") for m in modes):
        sys.exit(f"make_reference_layout.py: --real-needle: '{a.real_needle}': one of answer, needle, first, "
                 f"or one per picked needle ({len(pick)})")
    with open(a.haystack) as f:
        paras = [p.strip() for p in f.read().splitlines() if p.strip()]
    if not paras:
        sys.exit(f"make_reference_layout.py: {a.haystack} has no text")

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "needles.jsonl"), "w") as f:
        for p, mode in zip(pick, modes):
            r = rows[p]
            real = {"answer": r["answer"], "needle": r["needle"].rstrip().rstrip("."),
                    "first": r["needle"].split()[0].strip(",.")}[mode]
            f.write(json.dumps({"needle": r["needle"], "question": r["question"], "real_needle": real}) + "\n")
    for i in range(len(pick)):
        d = os.path.join(a.out, f"part{i + 1}")
        os.makedirs(d, exist_ok=True)
        for name in ("p1.txt", "p1.plain.txt"):
            if os.path.exists(os.path.join(d, name)):
                os.remove(os.path.join(d, name))
        k = i % len(paras)
        rot = paras[k:] + paras[:k]
        if a.style == "json":
            body = json.dumps({"rows": [{"row_idx": j, "row": {"text": t}} for j, t in enumerate(rot)]})
            name = "p1.txt"
        else:
            body = "\n\n".join(rot)
            name = "p1.plain.txt" if a.style == "plain" else "p1.txt"
        with open(os.path.join(d, name), "w") as f:
            f.write(body)
    print(a.out)


if __name__ == "__main__":
    main()
