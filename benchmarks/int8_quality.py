"""Is the int8 model good enough to be the app's default on a CPU? Its text against float32's, on held-out data.

For the bare model (the gated adapter's tau 1.0 and lossless output is the bare model): greedy text of
`fast` (float32, exact) and `fast-int8` on the held-out prompts; the mean NLL of each text under the float32
bare model (transformers' forward), its ratio to float32 greedy's own, exact and prefix match with float32
greedy, and known answers. `--taus` adds MARS rows with the adapter (--adapter, the shipped one by default)
on both backends, judged the same way. The bar (issue 24): NLL ratio <= 1.03 and known answers within one
question of float32's.

    nice python -m benchmarks.int8_quality --threads 2
    nice python -m benchmarks.int8_quality --threads 2 --taus 0.9 0.7 --json runs/int8_quality.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    import torch

    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.backend_quality import backend_quality, format_rows
    from mars.evaluation.bench import spread_indices
    from mars.models.loading import load
    from mars.training.data import read_jsonl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--adapter", default="auto", help="for the --taus rows (default: the shipped adapter)")
    ap.add_argument("--prompts", default=str(ROOT / "data/prompts/heldout.jsonl"))
    ap.add_argument("--known", default=str(ROOT / "data/prompts/known_answers.jsonl"))
    ap.add_argument("--limit", type=int, default=20, help="held-out prompts, spread over the file (every kind)")
    ap.add_argument("--known-limit", type=int, default=20, help="known-answer questions, spread likewise")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--backends", nargs="+", default=["fast", "fast-int8"])
    ap.add_argument("--taus", type=float, nargs="*", default=[])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    bare = load(args.model, adapter="none")
    rows_p = read_jsonl(args.prompts)
    prompts = [encode_prompt(bare.tokenizer, rows_p[i]["prompt"]) for i in spread_indices(len(rows_p), args.limit)]
    rows_k = read_jsonl(args.known)
    rows_k = [rows_k[i] for i in spread_indices(len(rows_k), args.known_limit)]
    known = ([encode_prompt(bare.tokenizer, r["prompt"]) for r in rows_k], [r["answer"] for r in rows_k])
    print(f"{len(prompts)} held-out prompts, {len(known[1])} known answers, {args.max_new_tokens} new tokens; "
          f"NLL under the float32 bare model; matches against backend 'fast' (float32)")
    rows = backend_quality(bare, bare, prompts, tuple(args.backends), args.max_new_tokens, known)
    print(format_rows(rows), flush=True)
    if args.taus:
        lm = load(args.model, adapter=args.adapter)
        for tau in args.taus:
            rows += backend_quality(lm, bare, prompts, tuple(args.backends), args.max_new_tokens, known,
                                    mode="mars", tau=tau)
        print(format_rows(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
