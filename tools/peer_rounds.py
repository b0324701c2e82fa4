"""llama.cpp against int8 core AR on a shared machine: prompt by prompt, interleaved, several rounds, each prompt's
fastest round per engine (a load that comes and goes inflates some rounds; the minimum is the least disturbed).

The bench (`python -m mars bench --methods ar,llamacpp`) times one round; this repeats it, swapping the engines'
order prompt by prompt. Needs llama-cpp-python (docs/peers.md).

    python -m tools.peer_rounds 10 3 96          # prompts (spread over data/prompts/heldout.jsonl), rounds, tokens
"""

from __future__ import annotations

import json
import sys
import time


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n, rounds, max_new = (int(a) for a in (argv + ["10", "3", "96"][len(argv):])[:3])
    import torch

    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
    from mars.evaluation.bench import read_prompts, spread_indices
    from mars.evaluation.llamacpp import LlamaCppPeer, skip_reason
    from mars.models.loading import load

    torch.set_num_threads(2)
    lm = load()
    why = skip_reason(lm)
    if why:
        raise SystemExit(why)
    ps = read_prompts("data/prompts/heldout.jsonl")
    ids = [encode_prompt(lm.tokenizer, ps[i]) for i in spread_indices(len(ps), n)]
    peer = LlamaCppPeer(2, max(map(len, ids)) + max_new + 8, lm.eos_token_ids)
    cfg = DecodeConfig(mode="ar", max_new_tokens=max_new, block_size=1, backend="fast-int8")
    engines = {"ar": lambda i: generate_ids(lm, [i], cfg)[0].token_ids, "llamacpp": lambda i: peer.generate(i, max_new)}
    for run in engines.values():
        run(ids[0])  # warm-up
    best = {m: [float("inf")] * len(ids) for m in engines}
    tokens = {m: [0] * len(ids) for m in engines}
    for r in range(rounds):
        for k, i in enumerate(ids):
            for name in (list(engines) if (r + k) % 2 == 0 else list(engines)[::-1]):
                t = time.perf_counter()
                out = engines[name](i)
                best[name][k] = min(best[name][k], time.perf_counter() - t)
                tokens[name][k] = len(out)
        rates = {m: sum(tokens[m]) / sum(best[m]) for m in engines}
        print(f"round {r}: " + ", ".join(f"{m} {v:.1f} tokens/s (best so far)" for m, v in rates.items()), flush=True)
    print(json.dumps({"tokens": tokens, "best_s": best, "tokens_per_s": rates}))
    print(f"core AR (fast-int8) {rates['ar']:.1f} tokens/s, llama.cpp {rates['llamacpp']:.1f} tokens/s: "
          f"core AR {rates['ar'] / rates['llamacpp']:.2f}x llama.cpp's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
