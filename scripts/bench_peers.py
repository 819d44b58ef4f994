"""The peers of scripts/bench.sh, section 6: what a user would run instead of headscope, on the same
random checkpoint, in the virtual environment scripts/setup_peers.sh makes (PyPI transformers and
TransformerLens; no hub access: HF_HUB_OFFLINE=1). Each subcommand prints one JSON object.

  bench_peers.py forward MODEL --peer hf-eager|hf-sdpa|tl [--batch B --seq T --reps R --threads N
                 --tokenizer DIR]
      Median forward time over R repetitions, all positions' logits, on the tokens `headscope bench`
      draws (torch.manual_seed(0), randint(0, V, [B, T])), and the first row's last-position logits
      (16 values) for the equality check. hf-*: LlamaForCausalLM with that attention implementation;
      tl: TransformerLens 4's TransformerBridge around it (boot_transformers(hf_model=...)), plain
      forward and run_with_cache of every hook_pattern with the induction / previous / duplicate
      stripes reduced from the cache (what `headscope bench` times as forward_pattern_capture_s).
  bench_peers.py needle MODEL RESULT.h5 --tokenizer DIR [--threads N]
      The retrieval-head reference loop as nightdessert/Retrieval_Head's retrieval_head_detection.py
      runs it, on the prompts `headscope retrieval` wrote to RESULT.h5: one prefill of the prompt but
      its last token (use_cache; sdpa, the CPU's best kernel; logits of the last position only), then
      a greedy decode with output_attentions=True (eager attention), per step each head's top-1 key
      over the whole prompt, credit 1/|answer| when it lies in the answer span and equals the
      generated token. Runs exactly as many steps as headscope generated (`--stop none`). Prints
      seconds per trial and whether the greedy tokens and per-trial scores equal headscope's.
  bench_peers.py study MODEL RESULT.h5 --tokenizer DIR [--threads N]
      The whole needle study as the reference scripts run it, in one warm process, on the prompts of a
      `headscope retrieval --ablate-top K --random-controls R` result: the detection loop above over
      every trial, then needle_in_haystack_with_mask.py's masked loop once per head set of the result
      (the named heads, then each control): the prefill unmasked, each decode step with the sets' queries
      zeroed (block_list: query_states[:, h] = 0; zeroing q_proj's head slice is the same, RoPE of 0 being
      0). Prints the seconds of each part and whether every greedy token and score equals headscope's.
"""
import argparse, json, os, sys, time, warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

# transformers 5.24 warns per call that past_key_values (the reference's spelling) becomes `cache`.
warnings.filterwarnings("ignore", category=FutureWarning)


DEVICE, DTYPE = "cpu", torch.float32  # --device / --dtype (scripts/device_check.sh: cuda, bfloat16)


def sync():
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def median_time(fn, reps):
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def load_hf(model, impl):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model, attn_implementation=impl, dtype=DTYPE).to(DEVICE).eval()


def load_tokenizer(path):
    # A folder with tokenizer.json, or GPT-2's vocab.json + merges.txt (../shared/testdata/gpt2-tokenizer,
    # which AutoTokenizer cannot place without a tokenizer_config.json).
    from transformers import AutoTokenizer, GPT2TokenizerFast
    if os.path.exists(os.path.join(path, "vocab.json")) and os.path.exists(os.path.join(path, "merges.txt")):
        return GPT2TokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def load_tl(model, tokenizer_dir):
    # TransformerLens 4 removed HookedTransformer; TransformerBridge is its model class. Booted around
    # a loaded HF model (no hub access); it switches the model to eager attention (hooks need the
    # pattern). Without enable_compatibility_mode() its logits equal HF's (no weight folding).
    from transformer_lens.model_bridge import TransformerBridge
    hf = load_hf(model, "eager")
    return TransformerBridge.boot_transformers(model, hf_model=hf, device=DEVICE, tokenizer=load_tokenizer(tokenizer_dir))


def versions():
    out = {"torch": torch.__version__}
    for m in ("transformers", "transformer_lens"):
        try:
            from importlib.metadata import version
            out[m] = version(m)
        except Exception:
            pass
    return out


def stripes(patterns, T):
    n = max(2, (T - 1) // 2)
    return [torch.diagonal(a, -back, -2, -1).sum(-1) for a in patterns for back in (n - 1, 1, n)]


def cmd_forward(a):
    torch.set_num_threads(a.threads)
    cfg = json.load(open(os.path.join(a.model, "config.json")))
    torch.manual_seed(a.seed)
    tokens = torch.randint(0, cfg["vocab_size"], (a.batch, a.seq)).to(DEVICE)
    out = {"peer": a.peer, **versions(), "threads": torch.get_num_threads(), "device": DEVICE, "dtype": str(DTYPE)}
    with torch.inference_mode():
        if a.peer in ("hf-eager", "hf-sdpa"):
            m = load_hf(a.model, a.peer[3:])
            fn = lambda: m(input_ids=tokens, use_cache=False).logits  # noqa: E731
        else:
            b = load_tl(a.model, a.tokenizer)
            fn = lambda: b(tokens)  # noqa: E731

            def capture():
                _, cache = b.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
                return stripes([cache[k] for k in sorted(cache.keys(), key=lambda k: int(k.split(".")[1]))], a.seq)
            out["forward_pattern_capture_s"] = median_time(capture, a.reps)
        out["forward_s"] = median_time(fn, a.reps)
        out["logits_probe"] = fn()[0, -1, :16].double().tolist()
    print(json.dumps(out))


def cmd_needle(a):
    import h5py
    import numpy as np
    torch.set_num_threads(a.threads)
    f = h5py.File(a.result, "r")
    t = f["retrieval/trials"]
    # The answer's span inside the needle (Wu et al.'s needle_start/needle_end); files of headscope
    # before answer_span existed credited the whole needle span.
    spans = t["answer_span"][()] if "answer_span" in t else t["needle_span"][()]
    prompts, gen_hs = t["prompt_tokens"][()], t["generated"][()]
    score_hs = t["retrieval"][()]
    tok = load_tokenizer(a.tokenizer)
    m = load_hf(a.model, "sdpa")
    L, H = m.config.num_hidden_layers, m.config.num_attention_heads
    per_trial, same_tokens, max_score_diff, lengths = [], True, 0.0, []
    with torch.no_grad():  # as the reference
        for i in range(prompts.shape[0]):
            n = int((prompts[i] >= 0).sum())
            ids = torch.from_numpy(prompts[i, :n]).long()[None].to(DEVICE)
            s, e = int(spans[i, 0]), int(spans[i, 1])
            steps = int((gen_hs[i] >= 0).sum())
            sync()
            t0 = time.perf_counter()
            m.set_attn_implementation("sdpa")
            q = m(input_ids=ids[:, :-1], use_cache=True, return_dict=True, logits_to_keep=1)
            m.set_attn_implementation("eager")  # output_attentions needs the materialized pattern
            past, inp = q.past_key_values, ids[:, -1]
            output, score = [], [[[0, ""] for _ in range(H)] for _ in range(L)]
            for _ in range(steps):
                inp = inp.view(1, 1)
                o = m(input_ids=inp, past_key_values=past, use_cache=True, output_attentions=True)
                past = o.past_key_values
                inp = o.logits[0, -1].argmax()
                step_token = tok.convert_ids_to_tokens(inp.item())
                output.append(inp.item())
                for l in range(L):  # the reference's retrieval_calculate, topk = 1
                    for h in range(H):
                        values, idx = o.attentions[l][0][h][-1].topk(1)
                        for v, j in zip(values, idx):
                            if s <= j < e and inp.item() == ids[0, j].item():
                                score[l][h][0] += 1 / (e - s)
                                score[l][h][1] += step_token
                                break
            sync()
            per_trial.append(time.perf_counter() - t0)
            lengths.append(n)
            same_tokens &= output == [int(x) for x in gen_hs[i, :steps]]
            got = np.array([[float(score[l][h][0]) for h in range(H)] for l in range(L)])
            max_score_diff = max(max_score_diff, float(np.abs(got - score_hs[i]).max()))
    print(json.dumps({"trials": len(per_trial), "per_trial_s": per_trial, "mean_trial_s": sum(per_trial) / len(per_trial),
                      "prompt_tokens": lengths, "decode_steps": steps, "same_tokens": bool(same_tokens),
                      "max_score_diff": max_score_diff, **versions(), "threads": torch.get_num_threads(),
                      "device": DEVICE, "dtype": str(DTYPE)}))


def detect_trial(m, ids, span, steps, L, H):
    """retrieval_head_detection.py's evaluate_and_log + decode + retrieval_calculate on one prompt."""
    s, e = span
    m.set_attn_implementation("sdpa")
    q = m(input_ids=ids[:, :-1], use_cache=True, return_dict=True, logits_to_keep=1)
    m.set_attn_implementation("eager")  # output_attentions needs the materialized pattern
    past, inp = q.past_key_values, ids[:, -1]
    output, score = [], [[0.0] * H for _ in range(L)]
    for _ in range(steps):
        inp = inp.view(1, 1)
        o = m(input_ids=inp, past_key_values=past, use_cache=True, output_attentions=True)
        past = o.past_key_values
        inp = o.logits[0, -1].argmax()
        output.append(inp.item())
        for l in range(L):
            for h in range(H):
                values, idx = o.attentions[l][0][h][-1].topk(1)
                for v, j in zip(values, idx):
                    if s <= j < e and inp.item() == ids[0, j].item():
                        score[l][h] += 1 / (e - s)
                        break
    return output, score


def masked_trial(m, ids, steps, block, hooks_on):
    """needle_in_haystack_with_mask.py: an unmasked prefill, then decode steps with block_list."""
    m.set_attn_implementation("sdpa")
    hooks_on[0] = False
    q = m(input_ids=ids[:, :-1], use_cache=True, return_dict=True, logits_to_keep=1)
    past, inp = q.past_key_values, ids[:, -1]
    output = []
    hooks_on[0] = True
    for _ in range(steps):
        inp = inp.view(1, 1)
        o = m(input_ids=inp, past_key_values=past, use_cache=True)
        past = o.past_key_values
        inp = o.logits[0, -1].argmax()
        output.append(inp.item())
    hooks_on[0] = False
    return output


def cmd_study(a):
    import h5py
    import numpy as np
    torch.set_num_threads(a.threads)
    f = h5py.File(a.result, "r")
    t = f["retrieval/trials"]
    spans, prompts, gen = t["answer_span"][()], t["prompt_tokens"][()], t["generated"][()]
    score_hs = t["retrieval"][()]
    ab = f["retrieval/ablation"]
    masks, abl_gen = ab["masks"][()], ab["generated"][()]
    m = load_hf(a.model, "sdpa")
    L, H = m.config.num_hidden_layers, m.config.num_attention_heads
    d = m.config.hidden_size // H
    # One hook per layer on q_proj zeroes the current set's heads while hooks_on[0].
    block, hooks_on = {"set": set()}, [False]
    for li, layer in enumerate(m.model.layers):
        def hook(mod, args, out, li=li):
            if not hooks_on[0]:
                return None
            heads = [h for (l, h) in block["set"] if l == li]
            if not heads:
                return None
            out = out.clone()
            for h in heads:
                out[..., h * d:(h + 1) * d] = 0
            return out
        layer.self_attn.q_proj.register_forward_hook(hook)
    N = prompts.shape[0]
    rows = []
    for i in range(N):
        n = int((prompts[i] >= 0).sum())
        rows.append(torch.from_numpy(prompts[i, :n]).long()[None].to(DEVICE))
    same_tokens, same_abl, max_diff = True, True, 0.0
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        for i in range(N):
            steps = int((gen[i] >= 0).sum())
            out, score = detect_trial(m, rows[i], (int(spans[i, 0]), int(spans[i, 1])), steps, L, H)
            same_tokens &= out == [int(x) for x in gen[i, :steps]]
            max_diff = max(max_diff, float(np.abs(np.array(score) - score_hs[i]).max()))
        sync()
        scan_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        for si in range(masks.shape[0]):
            block["set"] = {(l, h) for l in range(L) for h in range(H) if masks[si, l, h]}
            for i in range(N):
                steps = int((abl_gen[si, i] >= 0).sum())
                out = masked_trial(m, rows[i], steps, block, hooks_on)
                same_abl &= out == [int(x) for x in abl_gen[si, i, :steps]]
        sync()
        masked_s = time.perf_counter() - t1
    print(json.dumps({"trials": N, "sets": int(masks.shape[0]), "scan_s": scan_s, "masked_s": masked_s,
                      "study_s": scan_s + masked_s, "prompt_tokens": [int(r.shape[1]) for r in rows],
                      "same_tokens": bool(same_tokens), "same_ablated_tokens": bool(same_abl), "max_score_diff": max_diff,
                      **versions(), "threads": torch.get_num_threads(), "device": DEVICE, "dtype": str(DTYPE)}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("forward")
    p.add_argument("model")
    p.add_argument("--peer", choices=["hf-eager", "hf-sdpa", "tl"], required=True)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--tokenizer", help="tokenizer folder (tl needs one: TransformerBridge loads it)")
    p = sub.add_parser("needle")
    p.add_argument("model")
    p.add_argument("result")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p = sub.add_parser("study")
    p.add_argument("model")
    p.add_argument("result")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    for p in ap._subparsers._group_actions[0].choices.values():
        p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args()
    global DEVICE, DTYPE
    DEVICE, DTYPE = a.device, getattr(torch, a.dtype)
    if a.cmd == "forward" and a.peer == "tl" and not a.tokenizer:
        sys.exit("bench_peers.py: --peer tl needs --tokenizer")
    {"forward": cmd_forward, "needle": cmd_needle, "study": cmd_study}[a.cmd](a)


if __name__ == "__main__":
    main()
