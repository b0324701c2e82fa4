"""Tree drafts against AR and the chain, interleaved prompt by prompt: tokens per pass, inputs per pass, wall time.

    PYTHONPATH=. python scripts/tree_measure.py 10 all:4 all:8 all:16 last:8   # K spread prompts, then groups:N

Writes its figures after every prompt to /tmp/tree_measure.json (partial results survive an interruption)."""
import json, sys, time, torch
from mars.core.decoding import DecodeConfig, generate_ids, encode_prompt
from mars.evaluation.bench import read_prompts, spread_indices
from mars.models.loading import load
torch.set_num_threads(2)
lm = load()
prompts = read_prompts("data/prompts/heldout.jsonl")
spread = spread_indices(len(prompts), 20)
pick = [spread[i] for i in spread_indices(20, int(sys.argv[1]))]
T = 96
configs = {"ar": dict(mode="ar"), "verified_both": dict(mode="verified", verify_groups="last", drafts="both")}
for spec in sys.argv[2:]:
    g, n = spec.split(":")
    configs[f"tree_{g}:{n}"] = dict(mode="verified", verify_groups=g, drafts="both", tree_nodes=int(n))
res = {k: {"tokens": 0, "passes": 0, "seconds": 0.0, "inputs": 0, "exact": 0} for k in configs}
for n_done, i in enumerate(pick, 1):
    ids = encode_prompt(lm.tokenizer, prompts[i])
    ar = None
    for k, kw in configs.items():
        cfg = DecodeConfig(tau=0.0, block_size=lm.default_block_size, max_new_tokens=T, **kw)
        t0 = time.perf_counter()
        r = generate_ids(lm, [ids], cfg)[0]
        res[k]["seconds"] += time.perf_counter() - t0
        ar = ar or r.token_ids
        res[k]["tokens"] += r.tokens; res[k]["passes"] += r.passes; res[k]["exact"] += r.token_ids == ar
        res[k]["inputs"] += sum(s.input_len for s in r.steps)
    out = {k: {**v, "tokens_per_pass": v["tokens"] / v["passes"], "vs_ar": res["ar"]["seconds"] / v["seconds"],
               "input_per_pass": v["inputs"] / v["passes"]} for k, v in res.items()}
    json.dump({"prompts": n_done, "results": out}, open("/tmp/tree_measure.json", "w"), indent=1)
    print(n_done, {k: (round(v["tokens_per_pass"], 3), round(v["vs_ar"], 2)) for k, v in out.items()}, flush=True)
