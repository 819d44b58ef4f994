#!/usr/bin/env python3
"""Regenerates tests/data/rouge_table.json, the table tests/test_rouge.cpp checks src/text/rouge.cpp
against, from the reference implementations themselves: NLTK's Porter stemmer in its default mode
(NLTK_EXTENSIONS) and Google's rouge_score with RougeScorer(['rouge1', 'rougeL'], use_stemmer=True),
the scorer nightdessert/Retrieval_Head and aryopg/locos call.

The table holds
  - "stems": [word, stem] pairs, stemmed by the very stemmer object rouge_score builds (and checked
    against a fresh nltk.stem.porter.PorterStemmer()), chosen to exercise every rule of every step,
    NLTK's extensions and its irregular forms;
  - "pairs": (reference, candidate) texts with rouge_score's tokens for both and its rouge1 and rougeL
    precision / recall / fmeasure, scored with use_stemmer=True and again with use_stemmer=False.
    As in rouge_score, reference = the target (the expected answer), candidate = the prediction.

Usage: scripts/make_rouge_table.py [OUT]   (default: tests/data/rouge_table.json beside this script)

Needs nltk and rouge_score in one Python. Debian ships python3-nltk but not rouge_score, so a venv is
the usual way:  python3 -m venv /tmp/venv-rouge && /tmp/venv-rouge/bin/pip install rouge-score nltk
and then  HEADSCOPE_PYTHON=/tmp/venv-rouge/bin/python3 scripts/make_rouge_table.py
When the running Python lacks either, the script re-executes itself with the first of
$HEADSCOPE_PYTHON, /usr/bin/python3 and python3 on PATH that has both; when none has, it says so and
exits with status 3.
"""
import json
import os
import shutil
import subprocess
import sys

REEXEC_MARK = "HEADSCOPE_ROUGE_TABLE_REEXEC"
PROBE = "import nltk.stem.porter, rouge_score.rouge_scorer"


def import_or_reexec():
    try:
        import nltk.stem.porter  # noqa: F401
        import rouge_score.rouge_scorer  # noqa: F401
        return
    except ImportError as e:
        missing = e.name
    tried = [sys.executable]
    if not os.environ.get(REEXEC_MARK):
        # Paths compared as given, not resolved: a venv's python is a link to its base interpreter.
        for py in (os.environ.get("HEADSCOPE_PYTHON"), "/usr/bin/python3", shutil.which("python3")):
            if not py or not os.access(py, os.X_OK) or py in tried:
                continue
            tried.append(py)
            if subprocess.run([py, "-c", PROBE], capture_output=True).returncode == 0:
                os.environ[REEXEC_MARK] = "1"
                os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
    sys.stderr.write(
        f"make_rouge_table.py: error: no Python here has both nltk and rouge_score ({missing} missing in "
        f"{sys.executable}; tried {', '.join(tried)}). Make one:\n"
        f"  python3 -m venv /tmp/venv-rouge && /tmp/venv-rouge/bin/pip install rouge-score nltk\n"
        f"  HEADSCOPE_PYTHON=/tmp/venv-rouge/bin/python3 {sys.argv[0]} {' '.join(sys.argv[1:])}\n")
    sys.exit(3)


# Words for the stem table. Grouped by the rule they exercise; every entry is lower case (NLTK 3.8
# and 3.10 differ only on upper-case forms of the irregular words, which rouge_score never passes).
WORDS = [
    # irregular forms (NLTK_EXTENSIONS pool)
    "sky", "skies", "dying", "lying", "tying", "news", "innings", "inning", "outings", "outing",
    "cannings", "canning", "howe", "proceed", "exceed", "succeed",
    # one or two characters: returned as they are
    "a", "is", "as", "by", "us", "ed", "s",
    # step 1a
    "caresses", "ponies", "ties", "caress", "cats", "runs", "flies", "dies", "lies", "cries", "ies", "sses",
    # step 1b: eed, ed, ing, the ied extension, at/bl/iz, *d, m=1 and *o, NLTK's two-letter *o
    "feed", "agreed", "plastered", "bled", "motoring", "sing", "running", "conflated", "troubled", "sized",
    "hopping", "tanned", "falling", "hissing", "fizzed", "failing", "filing", "spied", "died", "tried",
    "aced", "axed", "owed", "ageing", "revved", "docced", "trekking", "studied", "study", "studies",
    "eating", "sitting", "sandwiches", "sandwich",
    # step 1c: NLTK's (*c and not c) Y -> I
    "happy", "enjoy", "spy", "fly", "try", "annoying", "monday", "toy", "syzygy", "yyyy", "prying", "days",
    # step 2 (including NLTK's alli-first, bli, fulli and logi)
    "relational", "conditional", "rational", "valenci", "hesitanci", "digitizer", "conformabli",
    "radicalli", "differentli", "vileli", "analogousli", "vietnamization", "predication", "operator",
    "feudalism", "decisiveness", "hopefulness", "callousness", "formaliti", "sensitiviti", "sensibiliti",
    "generously", "hopefully", "forcefully", "illegibly", "geology", "mythology", "analogies", "assemblies",
    "intentionally", "logically",
    # step 3
    "triplicate", "formative", "formalize", "electriciti", "electrical", "hopeful", "goodness",
    # step 4
    "revival", "allowance", "inference", "airliner", "gyroscopic", "adjustable", "defensible", "irritant",
    "replacement", "adjustment", "dependent", "adoption", "homologou", "communism", "activate",
    "angulariti", "homologous", "effective", "bowdlerize", "adoptions", "fusion",
    # step 5
    "probate", "rate", "cease", "controll", "roll", "generalization", "oscillators",
    # digits (consonants to the stemmer)
    "1990s", "2nd", "100", "u22ed", "3rds",
    # words of the needles' answers and questions
    "francisco", "dolores", "park", "sunny", "best", "thing", "things", "eiffel", "tower", "towers",
]


# (reference, candidate): reference is rouge_score's target (the answer), candidate its prediction.
PAIRS = [
    ("the runs", "running"),                   # stemmed: [the, run] vs [run] -> R = 0.5 exactly
    ("runs", "running"),
    ("the runs", "ran"),
    ("studies", "study"),
    ("flies", "fly"),                          # fli vs fly: 'fly' has 3 letters, so is not stemmed
    ("skies", "sky"),
    ("dying", "die"),
    ("news", "new"),
    ("hopefully generously", "hopeful generous"),
    ("relational conditional", "relate condition"),
    ("cats", "cat"),                           # 'cats' (4 letters) stems to 'cat'
    ("this is", "thi is"),                     # 'this' -> 'thi'
    ("eat a sandwich", "eating sandwiches"),   # [eat, a, sandwich] vs [eat, sandwich]
    ("sit in Dolores Park", "sitting at dolores parks on a sunny day"),
    ("The Eiffel Tower", "the eiffel tower."),
    ("San Francisco", "San-Francisco!!!"),
    ("PARIS", "paris"),
    ("1990s", "in the 1990s"),
    ("3.14", "3 14"),
    ("twenty-one", "twenty one"),
    ("don't", "do not"),
    ("snake_case", "snake case"),
    ("the the cat", "the cat the the"),        # clipped counts
    ("a b c d", "d c b a"),                    # rouge1 = 1, rougeL = 1/4
    ("a b a", "b a b a b"),
    ("answer", ""),                            # empty candidate
    ("", "something"),                         # empty reference
    ("", ""),
    ("x", "!!! ..."),                          # candidate of punctuation only
    ("café au lait", "cafe au lait"),          # é separates: [caf, au, lait]
    ("naïve", "naive"),
    ("Straße", "strasse"),
    ("東京 Tokyo", "Tokyo"),
    ("İstanbul", "istanbul"),                  # U+0130 lowers to i + U+0307: [i, stanbul]
    ("5 K", "5 \u212a"),                       # KELVIN SIGN lowers to ASCII k
    ("Kelvin", "\u212aelvin"),
    ("emoji \U0001F600 test", "emoji test"),
    ("line\none\ttab", "line one tab"),
    ("The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
     "The best thing to do in San Francisco is to eat a sandwich and sit in Dolores Park on a sunny day."),
    ("eat a sandwich and sit in Dolores Park on a sunny day",
     "Answer: The best thing to do in San Francisco is eating sandwiches while sitting in Dolores Park."),
    ("Dolores Park", "I don't know. The book does not say where; maybe a park?"),
    ("generalization", "generalizations generalize general"),
]


def main():
    import_or_reexec()
    import importlib.metadata
    import platform

    from nltk.stem import porter
    from rouge_score import rouge_scorer, tokenizers

    out = sys.argv[1] if len(sys.argv) > 1 else os.path.normpath(os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "rouge_table.json"))

    scorers = {stem: rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=stem) for stem in (True, False)}
    stemmer = scorers[True]._tokenizer._stemmer  # the object rouge_score stems with
    if tokenizers.porter is not porter or stemmer.mode != porter.PorterStemmer.NLTK_EXTENSIONS:
        sys.exit("make_rouge_table.py: rouge_score no longer stems with NLTK's default-mode PorterStemmer; "
                 "src/text/rouge.cpp needs revisiting")
    fresh = porter.PorterStemmer()

    stems = []
    for w in dict.fromkeys(WORDS):
        s = stemmer.stem(w)
        assert s == fresh.stem(w), w
        stems.append([w, s])

    def score(s):
        return {"precision": s.precision, "recall": s.recall, "fmeasure": s.fmeasure}

    pairs = []
    for ref, cand in PAIRS:
        for stem in (True, False):
            sc = scorers[stem]
            r = sc.score(ref, cand)
            pairs.append({
                "reference": ref, "candidate": cand, "use_stemmer": stem,
                "reference_tokens": sc._tokenizer.tokenize(ref),
                "candidate_tokens": sc._tokenizer.tokenize(cand),
                "rouge1": score(r["rouge1"]), "rougeL": score(r["rougeL"]),
            })

    table = {
        "generator": "scripts/make_rouge_table.py",
        "versions": {"python": platform.python_version(), "nltk": importlib.metadata.version("nltk"),
                     "rouge_score": importlib.metadata.version("rouge-score")},
        "stems": stems,
        "pairs": pairs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    # One stem or one pair a line, so a regenerated table diffs readably.
    def dumps(x):
        return json.dumps(x, ensure_ascii=False)

    with open(out, "w", encoding="utf-8") as f:
        f.write("{\n")
        for key in ("generator", "versions"):
            f.write(f" {dumps(key)}: {dumps(table[key])},\n")
        for key, last in (("stems", False), ("pairs", True)):
            f.write(f" {dumps(key)}: [\n")
            f.write(",\n".join("  " + dumps(x) for x in table[key]))
            f.write("\n ]" + ("\n" if last else ",\n"))
        f.write("}\n")
    with open(out, encoding="utf-8") as f:
        assert json.load(f) == table
    print(f"make_rouge_table.py: wrote {out}: {len(stems)} stems, {len(pairs)} scored pairs "
          f"(nltk {table['versions']['nltk']}, rouge_score {table['versions']['rouge_score']})")


if __name__ == "__main__":
    main()
