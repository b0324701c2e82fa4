"""Self-distilled MARS training data: the default model's own greedy answers to the project's prompts.

Each prompt is one user message through the chat template; the response is the model's greedy AR output
(the core's AR mode, batched). Resumable: finished ids are skipped, results are appended as they come.

    python -m tools.make_data --split heldout --out data/selfdistill/heldout.jsonl
    python -m tools.make_data --split train --out data/selfdistill/train.jsonl --threads 1

Each line: {"id", "kind", "prompt", "prompt_ids", "response_ids", "finished", "messages",
            "topk_ids", "topk_logprobs"}  (top-k of the model's own next-token distribution per response
token, for an optional distillation term; written only with --topk > 0).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="train", help="train, heldout or known_answers (data/prompts/<split>.jsonl)")
    ap.add_argument("--prompts", help="a prompt file instead of --split (.jsonl, or its packed .jsonl.gz)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop cleanly after this long (0 = no cap)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()

    import torch

    from mars.decoding.decoder import DecodeConfig, decode_steps, encode_prompt
    from mars.models.loading import load

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.prompts:
        from mars.training.data import read_jsonl

        path = Path(args.prompts)  # on a fresh clone only the committed, packed .jsonl.gz exists
        items = read_jsonl(path if path.exists() else path.with_name(path.name + ".gz"))
    else:
        items = [json.loads(line) for line in (PROMPTS / f"{args.split}.jsonl").read_text().splitlines() if line.strip()]
    if args.limit:
        items = items[: args.limit]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    packed = out.with_name(out.name + ".gz")
    if not out.exists() and packed.exists():  # a fresh clone: continue from the committed, packed rows
        import gzip

        out.write_bytes(gzip.decompress(packed.read_bytes()))
    if out.exists():
        for line in out.read_text().splitlines():
            try:
                done.add(json.loads(line)["id"])
            except (json.JSONDecodeError, KeyError):
                pass  # a line cut by an interruption: regenerated below
        good = [line for line in out.read_text().splitlines() if _ok(line)]
        out.write_text("".join(g + "\n" for g in good))
    todo = [it for it in items if it["id"] not in done]
    print(f"{len(done)} done, {len(todo)} to go -> {out}", flush=True)
    lm = load(adapter="none")
    tok = lm.tokenizer
    cfg = DecodeConfig(mode="ar", max_new_tokens=args.max_new_tokens, top_k=args.topk)
    # a seeded shuffle keeps any finished prefix of the run balanced across kinds; sorting by length inside
    # windows of 8 batches still puts similar prompt lengths together (less padding)
    import random

    random.Random(0).shuffle(todo)
    window = 8 * args.batch_size
    todo = [it for w in range(0, len(todo), window)
            for it in sorted(todo[w:w + window], key=lambda it: len(encode_prompt(tok, it["prompt"])))]
    t0 = time.time()
    n_done = 0
    for start in range(0, len(todo), args.batch_size):
        if args.max_minutes and time.time() - t0 > 60 * args.max_minutes:
            print("time cap reached: stopping (rerun to resume)", flush=True)
            break
        chunk = todo[start:start + args.batch_size]
        ids = [encode_prompt(tok, it["prompt"]) for it in chunk]
        resp = [[] for _ in chunk]
        topk = [[] for _ in chunk]
        finished = [False] * len(chunk)
        for records in decode_steps(lm, ids, cfg):
            for rec in records:
                resp[rec.row].extend(rec.token_ids)
                if args.topk and rec.candidates:
                    topk[rec.row].append(rec.candidates[0])
                if rec.finish_reason == "eos":
                    finished[rec.row] = True
        with out.open("a") as f:
            for it, p, r, k, fin in zip(chunk, ids, resp, topk, finished):
                row = {
                    "id": it["id"],
                    "kind": it.get("kind"),
                    "prompt": it["prompt"],
                    "prompt_ids": p,
                    "response_ids": r,
                    "finished": fin,
                    "messages": [
                        {"role": "user", "content": it["prompt"]},
                        {"role": "assistant", "content": tok.decode(r, skip_special_tokens=True)},
                    ],
                }
                if args.topk:
                    row["topk_ids"] = [[c[0] for c in step] for step in k]
                    row["topk_logprobs"] = [[round(math.log(max(c[1], 1e-12)), 4) for c in step] for step in k]
                f.write(json.dumps(row) + "\n")
        n_done += len(chunk)
        rate = n_done / (time.time() - t0)
        print(f"{n_done}/{len(todo)}  {rate * 60:.1f} prompts/min", flush=True)
    return 0


def _ok(line: str) -> bool:
    try:
        json.loads(line)
        return True
    except json.JSONDecodeError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
