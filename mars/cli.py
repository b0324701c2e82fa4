"""`python -m mars {generate,train}`: the command line over the library.

Errors exit non-zero with one line that says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _add_model_args(p: argparse.ArgumentParser):
    p.add_argument("--model", default=None, help="Hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--adapter", default="auto", help="adapter folder, 'none' for the bare model (default: shipped adapter)")
    p.add_argument("--mask-token", default=None, help="mask token string or id (default: the tokenizer's)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own Python code")
    p.add_argument("--dtype", default="float32")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m mars", description="MARS multi-token generation")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate answers to prompts")
    g.add_argument("prompts", nargs="+", help="one user message per prompt")
    _add_model_args(g)
    g.add_argument("--mode", default="mars", choices=["mars", "ar", "verified", "jacobi"])
    g.add_argument("--verify-groups", default="last", choices=["all", "last"],
                   help="verified mode: one mask group after all drafts (last, the default: fastest on a CPU) or "
                        "one per acceptance outcome (all: more tokens per pass, wider passes)")
    g.add_argument("--tau", type=float, default=None,
                   help="mars: accept proposals while confidence >= tau (default 0.9; 1.0 = plain AR). verified: "
                        "send only drafts with confidence >= tau to be checked; the text is AR's whatever tau "
                        "(default 0.0: send every draft, the fastest)")
    g.add_argument("--block-size", type=int, default=None, help="proposals per pass (default: as trained, else 4)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--confidence", default="prob", choices=["prob", "entropy", "margin"])
    g.add_argument("--max-tokens-per-pass", type=int, default=None)
    g.add_argument("--cache-block", type=int, default=32)
    g.add_argument("--batch", action="store_true", help="decode all prompts as one batch")
    g.add_argument("--no-cache", action="store_true", help="recompute everything every pass (reference path)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--system", default=None, help="a system message (none is added otherwise)")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--backend", default="auto", choices=["auto", "fast", "hf", "fast-bf16"],
                   help="what runs the model: auto = fast where supported; hf = transformers (reference); "
                        "fast-bf16 = bfloat16 matrices (faster, not exact)")

    t = sub.add_parser("train", help="fine-tune a model with the MARS objective")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--model", default=None)
    t.add_argument("--adapter", default=None, help="continue from this LoRA adapter")
    t.add_argument("--mask-token", default=None)
    t.add_argument("--block-size", type=int, default=4)
    t.add_argument("--method", default="lora", choices=["lora", "full"])
    t.add_argument("--lora-r", type=int, default=32)
    t.add_argument("--lora-alpha", type=int, default=64)
    t.add_argument("--lr", type=float, default=2e-4)
    t.add_argument("--schedule", default="cosine", choices=["cosine", "linear", "constant"])
    t.add_argument("--warmup-ratio", type=float, default=0.03)
    t.add_argument("--epochs", type=float, default=1.0)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--max-minutes", type=float, default=None)
    t.add_argument("--batch-size", type=int, default=2)
    t.add_argument("--grad-accum", type=int, default=4)
    t.add_argument("--max-length", type=int, default=512)
    t.add_argument("--keep-prompt-noisy", action="store_true", help="also feed noisy copies of prompt blocks")
    t.add_argument("--skip-last-slot", action="store_true")
    t.add_argument("--distill", type=float, default=0.0,
                   help="weight of a KL term keeping the clean copy close to the bare model (LoRA only)")
    t.add_argument("--save-every", type=int, default=25)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--dtype", default="float32")
    b = sub.add_parser("bench", help="benchmark MARS against AR and peers, side by side in one run")
    b.add_argument("--prompts", required=True, help="one prompt per line, or JSONL with a 'prompt' field")
    _add_model_args(b)
    b.add_argument("--methods", default="hf,ar,mars", help="comma list of hf,ar,mars,lookup,verified,verified_last,jacobi")
    b.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.9, 0.7])
    b.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    b.add_argument("--block-size", type=int, default=None)
    b.add_argument("--cache-block", type=int, default=32)
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--limit", type=int, default=None)
    b.add_argument("--spread", action="store_true",
                   help="with --limit: take prompts evenly spaced through the file (every kind), not the first ones")
    b.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    b.add_argument("--backend", default="auto", choices=["auto", "fast", "hf", "fast-bf16"],
                   help="what runs the model for the core's methods (ar, mars, verified, jacobi)")
    b.add_argument("--out", default=None, help="write the results as JSON here")
    e = sub.add_parser("eval", help="teacher-forced draft accuracy and decoding quality on held-out data")
    e.add_argument("--data", default="data/selfdistill/heldout.jsonl.gz", help="self-distilled JSONL, plain or .gz (held out)")
    _add_model_args(e)
    e.add_argument("--block-size", type=int, default=None)
    e.add_argument("--limit", type=int, default=40)
    e.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.95, 0.9, 0.8, 0.7, 0.5])
    e.add_argument("--max-new-tokens", type=int, default=64)
    e.add_argument("--known", default="data/prompts/known_answers.jsonl")
    e.add_argument("--known-limit", type=int, default=40)
    e.add_argument("--teacher-forced-only", action="store_true", help="skip generation (fast)")
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--out", default=None)
    return ap


def cmd_eval(args) -> int:
    import dataclasses

    import torch

    from mars.data import read_jsonl, to_example
    from mars.decoding import encode_prompt
    from mars.evaluate import decoding_eval, draft_accuracy
    from mars.loading import load

    _prepare_out(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code)
    block = args.block_size or lm.trained_block_size or 4
    records = read_jsonl(args.data)[: args.limit]
    examples = [to_example(r, lm.tokenizer, lm.eos_token_ids[0]) for r in records]
    report = {"model": lm.name, "adapter": lm.adapter, "block_size": block, "examples": len(examples)}
    report["draft_accuracy"] = dataclasses.asdict(draft_accuracy(lm, examples, block))
    print(json.dumps({"draft_accuracy": report["draft_accuracy"]["accuracy_by_distance"],
                      "est_tokens_per_pass": report["draft_accuracy"]["est_tokens_per_pass"]}), flush=True)
    if not args.teacher_forced_only:
        bare = load(args.model, "none", args.mask_token, args.dtype, args.trust_remote_code) if lm.adapter else lm
        prompts = [ex.prompt_ids for ex in examples]
        known = None
        if args.known and Path(args.known).is_file():
            rows = read_jsonl(args.known)
            rows = rows[:: max(1, len(rows) // max(1, args.known_limit))][: args.known_limit]  # every kind
            known = ([encode_prompt(lm.tokenizer, r["prompt"]) for r in rows], [r["answer"] for r in rows])
        report["decoding"] = decoding_eval(lm, bare, prompts, args.taus, block, args.max_new_tokens, known=known)
        for row in report["decoding"]:
            print(json.dumps({k: v for k, v in row.items() if k != "histogram"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


def _prepare_out(path: str | None) -> None:
    """Create --out's folder and check it is writable before a long run, not after it (results would be lost)."""
    if not path:
        return
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir() or not os.access(out.parent, os.W_OK):
        raise SystemExit(f"error: cannot write --out {path}")


def cmd_bench(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from mars.bench import (BenchConfig, compare_rows, format_compare, format_table, read_prompts, run_bench,
                            spread_indices, to_json)
    from mars.loading import load

    _prepare_out(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, kinds = read_prompts(args.prompts, with_kinds=True)
    keep = spread_indices(len(prompts), args.limit) if args.spread else list(range(len(prompts)))[: args.limit]
    prompts, kinds = [prompts[i] for i in keep], [kinds[i] for i in keep]
    cfg = BenchConfig(prompts=prompts, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                      taus=tuple(args.taus), batch_sizes=tuple(args.batch_sizes), block_size=args.block_size,
                      cache_block=args.cache_block, max_new_tokens=args.max_new_tokens, backend=args.backend)
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code)
    bar = tqdm(desc="bench", unit="batch")
    status: dict = {}
    runs = run_bench(lm, cfg, progress=lambda *a: bar.update(1), status=status)
    bar.close()
    print(format_table(runs))
    if status["interrupted"]:
        done = ", ".join(f"batch size {bs}: {n} of {status['total']} prompts" for bs, n in status["finished"].items())
        print(f"interrupted: counted only what every method finished ({done})", file=sys.stderr)
    taus = sorted((r.tau for r in runs if r.method == "mars"), reverse=True)
    if any(r.method == "lookup" for r in runs) and taus:  # where prompt lookup wins and loses against MARS
        mars_tau = 0.9 if 0.9 in taus else taus[0]
        print(format_compare(compare_rows(runs, ("mars", mars_tau), ("lookup", None), kinds),
                             f"mars@{mars_tau:g}", "lookup"))
    if args.out:
        from mars.plots import bench_html, bench_png

        data = to_json(lm, cfg, runs, kinds)
        out = Path(args.out)
        out.write_text(json.dumps(data, indent=2))
        if any(r["method"] == "mars" for r in data["runs"]):
            bench_png(data, out.with_suffix(".png"))
            bench_html(data, out.with_suffix(".html"))
        print(f"wrote {out} and its plots", file=sys.stderr)
    return 130 if status["interrupted"] else 0


def cmd_generate(args) -> int:
    from mars.decoding import DecodeConfig, GenerationResult, encode_prompt, generate_ids
    from mars.loading import load

    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code)
    for w in lm.warnings:
        print(f"warning: {w}", file=sys.stderr)
    block = args.block_size or lm.trained_block_size or 4
    cfg = DecodeConfig(
        mode=args.mode, block_size=block, confidence=args.confidence,
        tau=args.tau if args.tau is not None else 0.0 if args.mode == "verified" else 0.9,
        max_tokens_per_pass=args.max_tokens_per_pass, max_new_tokens=args.max_new_tokens,
        cache_block=args.cache_block, use_cache=not args.no_cache, stop_strings=tuple(args.stop),
        temperature=args.temperature, seed=args.seed, verify_groups=args.verify_groups, backend=args.backend,
    )
    prompts = [p for p in args.prompts]
    if any(not p.strip() for p in prompts):
        raise ValueError("empty prompt: give some text to answer")
    ids = [encode_prompt(lm.tokenizer, p, args.system) for p in prompts]
    results: list[GenerationResult]
    if args.batch:
        results = generate_ids(lm, ids, cfg)
    else:
        results = [generate_ids(lm, [i], cfg)[0] for i in ids]
    for prompt, res in zip(prompts, results):
        if args.json:
            print(json.dumps({"prompt": prompt, "mode": cfg.mode, "tau": cfg.tau, "block_size": block, **res.to_dict()}))
        else:
            print(res.text)
            print(
                f"[{cfg.mode} tau={cfg.tau} B={block}: {len(res.token_ids)} tokens in {res.forwards} forwards, "
                f"{res.tokens_per_forward:.2f} tokens/forward, {res.seconds:.2f} s]",
                file=sys.stderr,
            )
    return 0


def cmd_train(args) -> int:
    from mars.train import TrainConfig, train

    cfg = TrainConfig(
        data=args.data, out=args.out, model=args.model, adapter=args.adapter, mask_token=args.mask_token,
        block_size=args.block_size, method=args.method, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
        lr=args.lr, schedule=args.schedule, warmup_ratio=args.warmup_ratio, epochs=args.epochs,
        max_steps=args.max_steps, max_minutes=args.max_minutes, batch_size=args.batch_size,
        grad_accum=args.grad_accum, max_length=args.max_length, drop_prompt_noisy=not args.keep_prompt_noisy,
        skip_last_slot=args.skip_last_slot, distill=args.distill, save_every=args.save_every, seed=args.seed,
        threads=args.threads, dtype=args.dtype,
    )
    state = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # one summary line, from the main process
        print(json.dumps({"out": args.out, **state}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mars.loading import LoadError

    try:
        return {"generate": cmd_generate, "train": cmd_train, "bench": cmd_bench, "eval": cmd_eval}[args.command](args)
    except (LoadError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
