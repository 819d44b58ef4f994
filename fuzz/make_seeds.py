#!/usr/bin/python3
"""Builds the committed seed corpora fuzz/corpus/<target>/ and the fixed files in fuzz/data/ from
the repository's fixtures and datasets (and ../shared/testdata when present). Every seed is a valid
input, kept small. Run from the repository root: /usr/bin/python3 fuzz/make_seeds.py (Debian python3-h5py)
"""
import json, os, shutil, struct, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "testdata")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
DATA = os.path.join(ROOT, "fuzz", "data")
SEP = b"\n====headscope-fuzz-part====\n"  # fuzz_target.h kSeparator


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def parts(*ps):
    return SEP.join(p.encode() if isinstance(p, str) else p for p in ps)


# ---- safetensors ----
DT = {"F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": (None, 2), "I64": ("q", 8), "I32": ("i", 4),
      "I16": ("h", 2), "I8": ("b", 1), "U8": ("B", 1), "BOOL": ("?", 1)}


def safetensors(tensors, metadata=None, align=8):
    header, blobs, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        nb = n * DT[dtype][1]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nb]}
        blobs += bytes((i * 7 + 3) % 251 for i in range(nb))
        off += nb
    h = json.dumps(header, separators=(",", ":")).encode()
    while (8 + len(h)) % align:
        h += b" "
    return struct.pack("<Q", len(h)) + h + blobs


def real_header_shrunk(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    meta = h.pop("__metadata__", None)
    ts = [(k, v["dtype"], [min(s, 2) for s in v["shape"]]) for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0])]
    return safetensors(ts, meta)


put("safetensors", "two_f32", safetensors([("a", "F32", [2, 3]), ("b", "F32", [3])]))
put("safetensors", "dtypes", safetensors([(f"t_{d}", d, [2, 2]) for d in DT], {"format": "pt", "note": "x"}))
put("safetensors", "scalar_and_empty", safetensors([("s", "F32", []), ("e", "F16", [0, 4]), ("u", "U8", [5])]))
put("safetensors", "unaligned", safetensors([("x", "U8", [3]), ("y", "F32", [2])], align=1))
put("safetensors", "empty_header", safetensors([]))
for fam in ("gpt2", "gemma3", "gpt_neox"):
    put("safetensors", f"fixture_{fam}", real_header_shrunk(os.path.join(ROOT, "tests/fixtures/families", fam, "model.safetensors")))

# ---- config.json ----
fam_dir = os.path.join(ROOT, "tests/fixtures/families")
for fam in sorted(os.listdir(fam_dir)):
    p = os.path.join(fam_dir, fam, "config.json")
    if os.path.exists(p):
        put("config_json", fam, open(p, "rb").read())
if os.path.exists(os.path.join(SHARED, "tinystories-656k/config.json")):
    put("config_json", "tinystories", open(os.path.join(SHARED, "tinystories-656k/config.json"), "rb").read())


# ---- llama2.c checkpoints: header (7 int32) + float32 weights ----
def llama2c(dim, hidden, layers, heads, kv, vocab, seq, shared=True):
    hs = dim // heads
    kvd = kv * hs
    n = (vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kvd * dim + layers * dim * dim + layers * dim +
         3 * layers * hidden * dim + dim + seq * hs + (0 if shared else vocab * dim))
    hdr = struct.pack("<7i", dim, hidden, layers, heads, kv, vocab if shared else -vocab, seq)
    return hdr + struct.pack(f"<{n}f", *[((i * 37) % 101 - 50) / 500.0 for i in range(n)])


put("llama2c", "tiny_shared", llama2c(8, 16, 1, 2, 2, 8, 4, True))
put("llama2c", "tiny_unshared_gqa", llama2c(8, 12, 2, 4, 2, 6, 3, False))
put("llama2c", "header_only", struct.pack("<7i", 64, 172, 5, 8, 4, 512, 512))

# ---- llama2.c tokenizer .bin ----
for name in ("stories260K/tok512.bin", "aidreams260K/tok512.bin"):
    p = os.path.join(SHARED, name)
    if os.path.exists(p):
        put("tok_bin", name.split("/")[0], open(p, "rb").read())


def tok_bin(tokens):
    out = struct.pack("<I", max(len(t) for t, _ in tokens))
    for t, s in tokens:
        out += struct.pack("<fI", s, len(t)) + t
    return out


small = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)] + [(f"<0x{b:02X}>".encode(), 0.0) for b in range(256)]
small += [(b"\xe2\x96\x81", -1.0), (b"a", -2.0), (b"b", -3.0), (b"ab", -4.0), (b"\xe2\x96\x81a", -5.0), (b"\xe2\x96\x81ab", -6.0)]
put("tok_bin", "small_bytefallback", tok_bin(small))

# ---- tokenizer.json (+ tokenizer_config.json, + text to encode) ----
TEXT = "Once upon a time, Lily saw 12 cats.\nThe end! \u00e9\u4e2d <|start_story|> x"


def shrink_tinystories():
    p = os.path.join(SHARED, "tinystories-656k/tokenizer.json")
    j = json.load(open(p))
    m = j["model"]
    keep = {k: v for k, v in m["vocab"].items() if v < 3 or k.startswith("<0x") or len(k) == 1}
    merges = []
    for mg in m["merges"]:
        a, b = mg.split(" ") if isinstance(mg, str) else mg
        if a in keep and b in keep and (a + b) in m["vocab"]:
            keep[a + b] = m["vocab"][a + b]
            merges.append(mg)
        if len(merges) >= 80:
            break
    ids = sorted(set(keep.values()))
    remap = {old: i for i, old in enumerate(ids)}
    m["vocab"] = {k: remap[v] for k, v in keep.items()}
    m["merges"] = merges
    return j


if os.path.exists(os.path.join(SHARED, "tinystories-656k/tokenizer.json")):
    ts = shrink_tinystories()
    cfg = open(os.path.join(SHARED, "tinystories-656k/tokenizer_config.json")).read()
    put("tokenizer_json", "tinystories_shrunk", parts(json.dumps(ts, ensure_ascii=False), cfg, TEXT))
    put("tokenizer_json", "tinystories_shrunk_nocfg", parts(json.dumps(ts, ensure_ascii=False), "", TEXT))
    os.makedirs(DATA, exist_ok=True)
    with open(os.path.join(DATA, "sentencepiece_tokenizer.json"), "w") as f:
        json.dump(ts, f, ensure_ascii=False)


def byte_level_vocab():
    # GPT-2's printable byte map
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


chars = byte_level_vocab()
bl_vocab = {c: i for i, c in enumerate(chars)}
bl_merges = []
for a, b in [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("\u0120", "a"), ("1", "2")]:
    bl_vocab.setdefault(a + b, len(bl_vocab))
    bl_merges.append([a, b])
bl_vocab["<|endoftext|>"] = len(bl_vocab)
bytelevel = {
    "version": "1.0", "added_tokens": [{"id": bl_vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "post_processor": {"type": "ByteLevel", "trim_offsets": False},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
              "vocab": bl_vocab, "merges": bl_merges},
}
put("tokenizer_json", "bytelevel", parts(json.dumps(bytelevel, ensure_ascii=False), "", TEXT))
seq = json.loads(json.dumps(bytelevel))
seq["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
seq["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [bl_vocab["<|endoftext|>"]], "tokens": ["<|endoftext|>"]}}}
put("tokenizer_json", "llama3_style", parts(json.dumps(seq, ensure_ascii=False), '{"add_bos_token": true, "bos_token": "<|endoftext|>"}', TEXT))
os.makedirs(DATA, exist_ok=True)
with open(os.path.join(DATA, "bytelevel_tokenizer.json"), "w") as f:
    json.dump(bytelevel, f, ensure_ascii=False)

meta = {"version": "1.0", "added_tokens": [{"id": 0, "content": "<unk>", "special": True}, {"id": 1, "content": "<s>", "special": True},
                                           {"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Replace", "pattern": {"String": "  "}, "content": " "}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]},
        "post_processor": {"type": "BertProcessing", "cls": ["<s>", 1], "sep": ["</s>", 2]},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True, "continuing_subword_prefix": "##",
                  "vocab": dict([("<unk>", 0), ("<s>", 1), ("</s>", 2), ("\u2581", 3), ("a", 4), ("b", 5), ("##b", 6), ("ab", 7), ("\u2581a", 8)] +
                                [(f"<0x{b:02X}>", 9 + b) for b in range(256)]),
                  "merges": ["a ##b", "\u2581 a"]}}
put("tokenizer_json", "metaspace_wordpiece_prefix", parts(json.dumps(meta, ensure_ascii=False), '{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_eos_token": true}', "ab  ab\u00e9 a"))
ws = json.loads(json.dumps(meta))
ws["pre_tokenizer"] = {"type": "Whitespace"}
ws["decoder"] = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
ws["post_processor"] = {"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "RobertaProcessing", "cls": ["<s>", 1], "sep": ["</s>", 2]}]}
ws["model"]["end_of_word_suffix"] = "</w>"
ws["model"]["ignore_merges"] = True
put("tokenizer_json", "whitespace_sequence", parts(json.dumps(ws, ensure_ascii=False), "", "a b\tab."))

# ---- vocab.json + merges.txt (+ text) ----
gv = os.path.join(SHARED, "gpt2-tokenizer/vocab.json")
if os.path.exists(gv):
    vocab = json.load(open(gv, encoding="utf-8"))
    lines = open(os.path.join(SHARED, "gpt2-tokenizer/merges.txt"), encoding="utf-8").read().split("\n")
    keep = {c: vocab[c] for c in chars}
    out = [lines[0]]
    for ln in lines[1:]:
        if not ln:
            continue
        a, b = ln.split(" ")
        if a in keep and b in keep and a + b in vocab:
            keep[a + b] = vocab[a + b]
            out.append(ln)
        if len(out) > 150:
            break
    keep["<|endoftext|>"] = vocab["<|endoftext|>"]
    # Dense ids in GPT-2's order (the loader refuses ids far beyond the number of tokens).
    keep = {k: i for i, (k, _) in enumerate(sorted(keep.items(), key=lambda kv: kv[1]))}
    v_text = json.dumps(keep, ensure_ascii=False)
    put("vocab_merges", "gpt2_subset", parts(v_text, "\n".join(out) + "\n", TEXT))
    put("vocab_merges", "gpt2_subset_crlf", parts(v_text, "\r\n".join(out[1:]), "the then <|endoftext|> 123"))
    os.makedirs(os.path.join(DATA, "gpt2"), exist_ok=True)
    with open(os.path.join(DATA, "gpt2", "vocab.json"), "w", encoding="utf-8") as f:
        f.write(v_text)
    with open(os.path.join(DATA, "gpt2", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")

# ---- token-id files ----
put("tokens", "three_lines", "1, 2, 3\n\n4,5,6,7\n  8 \n")
put("tokens", "long_line", ",".join(str((i * 7919) % 512) for i in range(200)) + "\n")
put("tokens", "crlf_negative", "0,1\r\n-1,2\r\n")

# ---- text files (encoded with fixed tokenizers) ----
put("text", "story", open(os.path.join(ROOT, "datasets/examples/story.txt"), "rb").read()[:2048])
put("text", "haystack", open(os.path.join(ROOT, "datasets/needles/haystack.txt"), "rb").read()[:2048])
put("text", "unicode", "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001F600 tab\there\r\nend\u2581 <s> <|endoftext|>\n")

# ---- relations ----
for d in ("datasets/relations", "datasets/examples/relations"):
    for fn in sorted(os.listdir(os.path.join(ROOT, d))):
        raw = open(os.path.join(ROOT, d, fn), "rb").read()
        if len(raw) > 1500:  # keep seeds small: the same structure, fewer pairs
            j = json.loads(raw)
            if isinstance(j, dict):
                j["pairs"] = j["pairs"][:12]
            else:
                j = j[:12]
            raw = json.dumps(j, ensure_ascii=False).encode()
        put("relations", fn.replace(".json", ""), raw)
put("relations", "list_form", '[["a", "b"], ["cat", "cats"]]')
put("relations", "object_k", '{"name": "x", "category": "knowledge", "k": 3, "pairs": [["France", "Paris"]]}')

# ---- prompts: DLA prompt lists, needle files, experiment prompt lines ----
put("prompts", "dla_prompts", open(os.path.join(ROOT, "datasets/examples/dla-prompts.json"), "rb").read())
for fn in sorted(os.listdir(os.path.join(ROOT, "datasets/needles"))):
    if fn.endswith(".jsonl"):
        put("prompts", fn.replace(".jsonl", ""), open(os.path.join(ROOT, "datasets/needles", fn), "rb").read())
put("prompts", "toy_prompts", open(os.path.join(ROOT, "datasets/experiments/toy-induction-prompts.jsonl"), "rb").read())

# ---- YAML experiments ----
for fn in sorted(os.listdir(os.path.join(ROOT, "datasets/experiments"))):
    if fn.endswith(".yaml"):
        put("yaml", fn.replace(".yaml", ""), open(os.path.join(ROOT, "datasets/experiments", fn), "rb").read())
# Every ```yaml block of docs/experiments.md
doc = open(os.path.join(ROOT, "docs/experiments.md"), encoding="utf-8").read()
blocks = doc.split("```yaml")[1:]
for i, b in enumerate(blocks):
    put("yaml", f"doc_block_{i}", b.split("```")[0].lstrip("\n"))

# ---- Hugging Face cache trees (fuzz/targets/hub.cpp): the name, then one entry a part ----
# "f PATH\nCONTENT" a file, "d PATH" a folder, "l PATH\nNAME" a link to ../../blobs/NAME, "s PATH\nNAME" a
# link to NAME beside it; PATH relative to the cache root.
def hub_seeds():
    import hashlib
    h = lambda s: hashlib.sha256(s.encode()).hexdigest()
    A, B, C = h("A")[:40], h("B")[:40], h("C")[:40]
    R = "models--tiny--stories"
    cfg = '{"model_type": "llama"}'

    def snap(commit, files, repo=R):
        out = []
        for name, content in files:
            out += [f"f {repo}/blobs/{h(content)}\n{content}", f"l {repo}/snapshots/{commit}/{name}\n{h(content)}"]
        return out
    files = [("config.json", cfg), ("tokenizer.json", '{"model": {}}'), ("model.safetensors", "x")]
    put("hub", "main", parts("tiny/stories", f"f {R}/refs/main\n{A}", *snap(A, files),
                             f"l {R}/snapshots/{A}/README.md\n{'e' * 64}"))
    put("hub", "tag_newline", parts("tiny/stories@v1", f"f {R}/refs/v1\n{B}\n", *snap(B, files[:1])))
    put("hub", "commit_no_ref", parts(f"tiny/stories@{C}", f"f {R}/refs/main\n{A}", *snap(C, files)))
    put("hub", "pr_ref", parts("org/model@refs/pr/1", f"f models--org--model/refs/refs/pr/1\n{A}",
                               *snap(A, files[:1], "models--org--model")))
    put("hub", "broken_link", parts("tiny/stories", f"f {R}/refs/main\n{A}", *snap(A, files[:1]),
                                    f"l {R}/snapshots/{A}/model.safetensors\n{'0' * 64}"))
    put("hub", "empty_ref", parts("tiny/stories", f"f {R}/refs/main\n", *snap(A, files[:1])))
    put("hub", "ref_not_hash", parts("tiny/stories@main", f"f {R}/refs/main\nnot a commit\n\x01", *snap(A, files[:1])))
    put("hub", "no_snapshot", parts("tiny/stories", f"f {R}/refs/main\n{A}", f"d {R}/snapshots"))
    put("hub", "no_such_revision", parts("tiny/stories@dev", *[f"f {R}/refs/r{i}\n{A}" for i in range(10)],
                                         *snap(A, files[:1])))
    put("hub", "not_cached", parts("Qwen/Qwen2.5-0.5B", f"d {R}/refs"))
    put("hub", "not_a_name", parts("./models/x.gguf", f"f {R}/refs/main\n{A}"))
    put("hub", "linked_repo", parts("org/alias", f"s models--org--alias\n{R}", f"f {R}/refs/main\n{A}",
                                    f"s {R}/snapshots/{B}\n{A}", *snap(A, files[:1])))


hub_seeds()

# ---- HDF5 result files (h5py, the layout docs/hdf5-schema.md describes) ----
try:
    import h5py
    import numpy as np

    def h5(name, build):
        d = os.path.join(CORPUS, "hdf5")
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, name)
        with h5py.File(p, "w", libver="earliest") as f:
            build(f)

    def scores(f):
        m = f.create_group("meta")
        m.attrs["tool"] = "headscope"
        m.attrs["n_layers"] = np.int64(2)
        m.attrs["n_heads"] = np.int64(4)
        f.attrs["format_version"] = np.int64(1)
        g = f.create_group("scores/induction")
        g.create_dataset("score", data=np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
        g.attrs["description"] = "stripe"
        g.attrs["lengths"] = np.array([10, 20], dtype=np.int64)
        g.attrs["weights"] = np.array([0.5, 1.5])
        g.attrs["names"] = np.array([b"a", b"bc"], dtype=h5py.string_dtype())
        g.create_dataset("samples", data=np.ones((3, 2, 4), dtype=np.float32))

    def data_tokens(f):
        f.create_dataset("data/repeats/tokens", data=np.array([[1, 2, 3, -1], [4, 5, 6, 7]], dtype=np.int32))
        f.create_dataset("data/repeats/ids64", data=np.array([1, 2], dtype=np.int64))
        f.create_dataset("data/repeats/mask", data=np.array([1, 0, 1], dtype=np.uint8))
        f.create_dataset("data/repeats/names", data=np.array(["L0H1", "L1H3"], dtype=h5py.string_dtype()))
        f.create_dataset("ablation/single/metric", data=np.zeros((2, 3), dtype=np.float64))

    h5("scores.h5", scores)
    h5("data_tokens.h5", data_tokens)
except ImportError:
    print("h5py missing: no HDF5 seeds", file=sys.stderr)

total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(ROOT, "fuzz")) for f in fs)
print(f"fuzz/: {total / 1024:.0f} KiB")
