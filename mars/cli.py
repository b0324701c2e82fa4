"""`python -m mars {generate,train,bench,eval,calibrate,accept,settings}`: the command line over the library.

Errors exit non-zero with one line that says what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path



OOM_ADVICE = {  # what to lower, per command, when a run runs out of GPU memory
    "generate": "fewer prompts with --batch, a smaller --max-new-tokens, or --device cpu",
    "bench": "smaller --batch-sizes or --max-new-tokens, or --device cpu",
    "eval": "a smaller --limit or --max-new-tokens, or --device cpu",
    "calibrate": "a smaller --limit, or --device cpu",
    "accept": "fewer prompts or a smaller --max-new-tokens or --rows-per-forward, or --device cpu",
    "train": "a smaller --batch-size (raise --grad-accum to keep the batch) or --max-length, or --device cpu",
}


def _add_model_args(p: argparse.ArgumentParser):
    p.add_argument("--model", default=None, help="Hub id or local folder (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--adapter", default="auto", help="adapter folder, 'none' for the bare model (default: shipped adapter)")
    p.add_argument("--mask-token", default=None, help="mask token string or id (default: the tokenizer's)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the checkpoint's own Python code")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where the model runs: auto = CUDA when present, else the CPU")
    p.add_argument("--dtype", default=None, help="weights' dtype (default: bfloat16 on CUDA, float32 on the CPU)")


def repeat_tau(value: str) -> float | None:
    """--repeat-tau's value: a number (checked by DecodeConfig), or off / none for no guard."""
    if value.lower() in ("off", "none"):
        return None
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number between 0 and 1, or off; got {value!r}") from None


def _add_repeat_tau(p: argparse.ArgumentParser):
    p.add_argument("--repeat-tau", default=argparse.SUPPRESS, type=repeat_tau,
                   help="mars: a draft repeating the 1 or 2 tokens before it must also clear this confidence "
                        "(1.0: never accepted as a draft; off: no guard; default: the library's, see docs/stutter.md)")


def _repeat_tau(args) -> dict:
    """The flag when given ('off' gives None: no guard), else nothing: the config's own default applies."""
    return {"repeat_tau": args.repeat_tau} if hasattr(args, "repeat_tau") else {}


def build_parser() -> argparse.ArgumentParser:
    # choices come from the registries, so a new mode, backend or measure reaches the CLI by itself
    from mars.decoding.acceptance import CONFIDENCE_MEASURES
    from mars.runtime.backends import BACKENDS
    from mars.evaluation.bench import METHODS
    from mars.decoding.decoder import DEFAULT_CACHE_BLOCK
    from mars.decoding.modes import DRAFT_SOURCES, MODES, VERIFY_GROUPS

    ap = argparse.ArgumentParser(prog="python -m mars", description="MARS multi-token generation")
    sub = ap.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate answers to prompts")
    g.add_argument("prompts", nargs="+", help="one user message per prompt")
    _add_model_args(g)
    g.add_argument("--mode", default="mars", choices=list(MODES))
    g.add_argument("--verify-groups", default="last", choices=list(VERIFY_GROUPS),
                   help="verified mode: one mask group after all drafts (last, the default: fastest on a CPU) or "
                        "one per acceptance outcome (all: more tokens per pass, wider passes)")
    g.add_argument("--drafts", default="mars", choices=list(DRAFT_SOURCES),
                   help="verified mode: drafts from the mask positions (mars), n-gram lookup in the prompt and "
                        "text so far (lookup), or whichever is expected to be accepted more, pass by pass (both)")
    g.add_argument("--tree-nodes", default="0",
                   help="verified mode: check a tree of up to N draft tokens per pass (mask candidates and lookup "
                        "copies) instead of one chain; 'auto' = this device's measured best; 0 = one chain (default)")
    g.add_argument("--datastore", action="store_true",
                   help="verified mode with a tree and lookup drafts: where the text offers no copy, a chain from the "
                        "n-gram table of the default model's own answers (mars.decoding.datastore; the app's default)")
    g.add_argument("--tree-groups", type=int, default=None,
                   help="verified mode with a tree and --verify-groups last: mask groups on this many of the nodes "
                        "likeliest to end the path (default: by device, 1 on a CPU, 3 on a GPU)")
    g.add_argument("--tau", type=float, default=None,
                   help="mars: accept proposals while confidence >= tau (default 0.9; 1.0 = plain AR). verified: "
                        "send only drafts with confidence >= tau to be checked; the text is AR's whatever tau "
                        "(default 0.0: send every draft, the fastest)")
    g.add_argument("--block-size", type=int, default=None, help="proposals per pass (default: as trained, else 4)")
    _add_repeat_tau(g)
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--confidence", default="prob", choices=list(CONFIDENCE_MEASURES))
    g.add_argument("--max-tokens-per-pass", type=int, default=None)
    g.add_argument("--cache-block", type=int, default=DEFAULT_CACHE_BLOCK)
    g.add_argument("--batch", action="store_true", help="decode all prompts as one batch")
    g.add_argument("--no-cache", action="store_true", help="recompute everything every pass (reference path)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--system", default=None, help="a system message (none is added otherwise)")
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    g.add_argument("--backend", default="auto", choices=list(BACKENDS),
                   help="what runs the model: auto = fast where supported; hf = transformers (reference); "
                        "fast-bf16 = bfloat16 matrices (faster, not exact)")

    a = sub.add_parser("accept", help="the acceptance lab: each mask depth's drafts measured teacher-forced on the "
                                      "model's own answers (reliability, ECE, predicted vs measured tokens/pass)")
    a.add_argument("prompts", nargs="*", help="one user message per prompt (at most 16)")
    _add_model_args(a)
    a.add_argument("--set", default=None, dest="prompt_set",
                   help="a built-in set of training-side prompts: facts, lists, code, stories, math or rewrites")
    a.add_argument("--out", default=None, help="write the data here: .json or .csv (default: a summary only)")
    both = a.add_mutually_exclusive_group()
    both.add_argument("--compare", action="store_true",
                      help="also the bare model (the gated adapter closed), side by side with the adapter")
    both.add_argument("--bare", action="store_true", help="the bare model only (the gated adapter closed)")
    a.add_argument("--block-size", type=int, default=None, help="B (default: as trained, else 4)")
    a.add_argument("--max-new-tokens", type=int, default=128)
    a.add_argument("--tau", type=float, default=0.9, help="the tables' and the token classes' tau")
    a.add_argument("--taus", default="0.9,0.7,0.5",
                   help="taus decoded to measure tokens/pass beside the prediction ('' = predicted only)")
    a.add_argument("--rows-per-forward", type=int, default=None, help="mask rows per teacher-forced forward")
    a.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    a.add_argument("--backend", default="auto-int8", choices=list(BACKENDS),
                   help="what runs the model (default auto-int8, the app's: int8 matrices on a CPU)")

    t = sub.add_parser("train", help="fine-tune a model with the MARS objective")
    t.add_argument("--data", required=True, nargs="+", help="self-distilled JSONL (.gz) files, read as one set")
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
    t.add_argument("--max-cpu-minutes", type=float, default=None,
                   help="stop after this much CPU time of the process (fair budgets for runs sharing cores)")
    t.add_argument("--batch-size", type=int, default=2)
    t.add_argument("--grad-accum", type=int, default=4)
    t.add_argument("--max-length", type=int, default=512)
    t.add_argument("--keep-prompt-noisy", action="store_true", help="also feed noisy copies of prompt blocks")
    t.add_argument("--skip-last-slot", action="store_true",
                   help="no loss on the last noisy slot of a block (distance B+1: the decoder never uses it)")
    t.add_argument("--loss-weighting", default="token", choices=["token", "sequence"],
                   help="token: each stream's CE averaged over all its scored tokens (default); sequence: the "
                        "authors' weighting, averaged per sequence, then over the batch")
    t.add_argument("--shift-blocks", action="store_true",
                   help="each time an example is drawn, its noisy block grid starts at a random offset in [0, B)")
    t.add_argument("--noisy-copies", type=int, default=1,
                   help="noisy copies per clean copy, each on its own block grid (distinct offsets: the first "
                        "stays at 0 unless --shift-blocks); more mask targets per clean forward")
    t.add_argument("--gated", action="store_true",
                   help="the adapter acts only at mask positions: real tokens run the bare model (tau 1.0 = the bare "
                        "model's greedy output) and the clean copy runs once without gradient")
    t.add_argument("--distill", type=float, default=0.0,
                   help="weight of a KL term keeping the clean copy close to the bare model (LoRA only)")
    t.add_argument("--save-every", type=int, default=25)
    t.add_argument("--select-data", default=None,
                   help="held-out JSONL: at every checkpoint (and the end) count teacher-forced drafts at or above "
                        "--select-threshold and how many are right (<out>/snapshots.jsonl); keep in <out>/best the "
                        "snapshot with the most such drafts among those where >= --select-precision are right")
    t.add_argument("--select-limit", type=int, default=50, help="held-out examples per snapshot evaluation")
    t.add_argument("--select-threshold", type=float, default=0.9)
    t.add_argument("--select-precision", type=float, default=0.9)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--dtype", default="float32")
    t.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="where to train: auto = CUDA when present, else the CPU (accelerate launch picks its own)")
    t.add_argument("--autocast", choices=["bfloat16", "none"], default=None,
                   help="run the forward's matmuls in bfloat16 (weights, adapter and optimizer stay --dtype): "
                        "the default on CUDA; ~0.7x the step time on a CPU with AMX; refused on AVX2-only CPUs")
    t.add_argument("--workers", type=int, default=None,
                   help="DataLoader processes building the batch layout off the training loop "
                        "(default: 4 on CUDA, 0 on the CPU, whose cores the step needs)")
    b = sub.add_parser("bench", help="benchmark MARS against AR and peers, side by side in one run")
    b.add_argument("--prompts", required=True, help="one prompt per line, or JSONL with a 'prompt' field")
    _add_model_args(b)
    b.add_argument("--methods", default="hf,ar,mars", help=f"comma list of {','.join(METHODS)}")
    b.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.9, 0.7])
    b.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    b.add_argument("--block-size", type=int, default=None)
    _add_repeat_tau(b)
    b.add_argument("--cache-block", type=int, default=DEFAULT_CACHE_BLOCK)
    b.add_argument("--max-new-tokens", type=int, default=64)
    b.add_argument("--limit", type=int, default=None)
    b.add_argument("--spread", action="store_true",
                   help="with --limit: take prompts evenly spaced through the file (every kind), not the first ones")
    b.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    b.add_argument("--backend", default="auto", choices=list(BACKENDS),
                   help="what runs the model for the core's methods (ar, mars, verified, jacobi)")
    b.add_argument("--also-backends", nargs="+", default=[], choices=list(BACKENDS),
                   help="run the core's methods on these backends too (as method@backend), against the same AR")
    b.add_argument("--tree-nodes", type=int, nargs="+", default=[16],
                   help="verified_tree / verified_tree_last: draft nodes per pass, one run per value")
    b.add_argument("--out", default=None, help="write the results as JSON here")
    e = sub.add_parser("eval", help="teacher-forced draft accuracy and decoding quality on held-out data")
    e.add_argument("--data", default="data/selfdistill/heldout.jsonl.gz", help="self-distilled JSONL, plain or .gz (held out)")
    _add_model_args(e)
    e.add_argument("--block-size", type=int, default=None)
    e.add_argument("--limit", type=int, default=40)
    e.add_argument("--taus", type=float, nargs="+", default=[1.0, 0.95, 0.9, 0.8, 0.7, 0.5])
    e.add_argument("--max-new-tokens", type=int, default=64)
    _add_repeat_tau(e)
    e.add_argument("--known", default="data/prompts/known_answers.jsonl")
    e.add_argument("--known-limit", type=int, default=40)
    e.add_argument("--teacher-forced-only", action="store_true", help="skip generation (fast)")
    e.add_argument("--threads", type=int, default=0)
    e.add_argument("--out", default=None)
    c = sub.add_parser("calibrate", help="fit per-mask-distance draft temperatures on held-out teacher-forced drafts")
    c.add_argument("--data", default="data/selfdistill/heldout.jsonl.gz", help="self-distilled JSONL, plain or .gz (held out)")
    _add_model_args(c)
    c.add_argument("--block-size", type=int, default=None, help="default: as trained, else 4")
    c.add_argument("--limit", type=int, default=100, help="held-out examples used in all")
    c.add_argument("--fit-share", type=float, default=0.5,
                   help="the first share of them fits the temperatures, the rest measures before/after")
    c.add_argument("--threshold", type=float, default=0.9, help="drafts counted as confident: confidence >= this")
    c.add_argument("--threads", type=int, default=0)
    c.add_argument("--out", required=True,
                   help="folder for the calibrated copy of the adapter (its mars.json gains 'calibration') "
                        "and calibration.json; the source adapter is never changed")
    sub.add_parser("settings", help="the environment variables the app and the runtime read (mars.settings), "
                                    "as a Markdown table")
    return ap


def cmd_calibrate(args) -> int:
    import shutil

    import torch

    from mars.jsonl import read_jsonl
    from mars.training.data import to_example
    from mars.evaluation.evaluate import draft_accuracy, fit_temperatures
    from mars.models.loading import ADAPTER_WEIGHTS, MARS_META, load

    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0.0 < args.fit_share < 1.0:
        raise ValueError("--fit-share must be between 0 and 1 (some examples fit, the others measure)")
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code, args.device)
    if lm.adapter is None:
        raise ValueError("calibrate writes a calibrated copy of an adapter: pass --adapter DIR (or use the default model)")
    out = Path(args.out)
    if out.resolve() == Path(lm.adapter).resolve():
        raise ValueError("--out must not be the source adapter folder")
    block = args.block_size or lm.trained_block_size or 4
    records = read_jsonl(args.data)[: args.limit]
    examples = [to_example(r, lm.tokenizer, lm.eos_token_ids[0]) for r in records]
    n_fit = max(1, int(len(examples) * args.fit_share))
    fit, held = examples[:n_fit], examples[n_fit:]
    if not held:
        raise ValueError("no examples left to measure: raise --limit or lower --fit-share")
    cal = fit_temperatures(lm, fit, block)
    before = draft_accuracy(lm, held, block, threshold=args.threshold)
    after = draft_accuracy(lm, held, block, threshold=args.threshold, temperatures=cal["temperatures"])
    report = {"adapter": lm.adapter, "block_size": block, "data": args.data, "fit_examples": len(fit),
              "measure_examples": len(held), **cal,
              "before": before.confident, "after": after.confident,
              "calibration_bins_before": before.calibration, "calibration_bins_after": after.calibration}
    out.mkdir(parents=True, exist_ok=True)
    src = Path(lm.adapter)
    for name in (ADAPTER_WEIGHTS, "adapter_config.json"):
        shutil.copy2(src / name, out / name)
    meta_path = src / MARS_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    meta["calibration"] = {"temperatures": cal["temperatures"], "method": "per-mask-index temperature, min NLL",
                           "data": args.data, "fit_examples": len(fit), "drafts": cal["drafts"],
                           "before": before.confident, "after": after.confident}
    (out / MARS_META).write_text(json.dumps(meta, indent=2))
    (out / "calibration.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: report[k] for k in ("temperatures", "nll_before", "nll_after", "before", "after")}))
    return 0


def cmd_eval(args) -> int:
    import dataclasses

    import torch

    from mars.jsonl import read_jsonl
    from mars.training.data import to_example
    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.evaluate import decoding_eval, draft_accuracy
    from mars.models.loading import load

    _prepare_out(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code, args.device)
    block = args.block_size or lm.default_block_size
    records = read_jsonl(args.data)[: args.limit]
    examples = [to_example(r, lm.tokenizer, lm.eos_token_ids[0]) for r in records]
    report = {"model": lm.name, "adapter": lm.adapter, "block_size": block, "examples": len(examples)}
    report["draft_accuracy"] = dataclasses.asdict(draft_accuracy(lm, examples, block))
    print(json.dumps({"draft_accuracy": report["draft_accuracy"]["accuracy_by_distance"],
                      "est_tokens_per_pass": report["draft_accuracy"]["est_tokens_per_pass"],
                      "confident_drafts": report["draft_accuracy"]["confident"]}), flush=True)
    if not args.teacher_forced_only:
        bare = load(args.model, "none", args.mask_token, args.dtype, args.trust_remote_code,
                    lm.model.device.type) if lm.adapter else lm
        prompts = [ex.prompt_ids for ex in examples]
        known = None
        if args.known and Path(args.known).is_file():
            rows = read_jsonl(args.known)
            rows = rows[:: max(1, len(rows) // max(1, args.known_limit))][: args.known_limit]  # every kind
            known = ([encode_prompt(lm.tokenizer, r["prompt"]) for r in rows], [r["answer"] for r in rows])
        report["decoding"] = decoding_eval(lm, bare, prompts, args.taus, block, args.max_new_tokens, known=known,
                                           **_repeat_tau(args))
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

    from mars.evaluation.bench import (BenchConfig, by_kind, compare_rows, format_by_kind, format_compare, format_table,
                                       narrow_pass_warnings, peer_lines, read_prompts, run_bench, spread_indices,
                                       to_json)
    from mars.models.loading import load

    _prepare_out(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, kinds = read_prompts(args.prompts, with_kinds=True)
    keep = spread_indices(len(prompts), args.limit) if args.spread else list(range(len(prompts)))[: args.limit]
    prompts, kinds = [prompts[i] for i in keep], [kinds[i] for i in keep]
    cfg = BenchConfig(prompts=prompts, methods=tuple(m.strip() for m in args.methods.split(",") if m.strip()),
                      taus=tuple(args.taus), batch_sizes=tuple(args.batch_sizes), block_size=args.block_size,
                      cache_block=args.cache_block, max_new_tokens=args.max_new_tokens, backend=args.backend,
                      tree_nodes=tuple(args.tree_nodes), also_backends=tuple(args.also_backends), **_repeat_tau(args))
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code, args.device)
    say_int8_fallback(lm.model, args.backend, *args.also_backends)
    bar = tqdm(desc="bench", unit="batch")
    status: dict = {}
    runs = run_bench(lm, cfg, progress=lambda *a: bar.update(1), status=status)
    bar.close()
    print(format_table(runs))
    for line in peer_lines(runs, args.backend):
        print(line)
    for line in narrow_pass_warnings(runs):
        print(line, file=sys.stderr)
    if status["interrupted"]:
        done = ", ".join(f"batch size {bs}: {n} of {status['total']} prompts" for bs, n in status["finished"].items())
        print(f"interrupted: counted only what every method finished ({done})", file=sys.stderr)
    taus = sorted((r.tau for r in runs if r.method == "mars"), reverse=True)
    if any(r.method == "lookup" for r in runs) and taus:  # where prompt lookup wins and loses against MARS
        mars_tau = 0.9 if 0.9 in taus else taus[0]
        print(format_compare(compare_rows(runs, ("mars", mars_tau), ("lookup", None), kinds),
                             f"mars@{mars_tau:g}", "lookup"))
    if 1 in cfg.batch_sizes and any(kinds) and any(r.batch_size == 1 for r in runs):
        print(format_by_kind(by_kind(runs, kinds)))
    if args.out:
        from mars.evaluation.plots import bench_html, bench_png

        data = to_json(lm, cfg, runs, kinds)
        data["failed"] = status.get("failed", {})
        data["skipped"] = status.get("skipped", {})
        data["llamacpp"] = status.get("llamacpp")
        out = Path(args.out)
        out.write_text(json.dumps(data, indent=2))
        plots = " and its plots"
        if any(r["method"] == "mars" for r in data["runs"]):
            try:
                bench_png(data, out.with_suffix(".png"))
                bench_html(data, out.with_suffix(".html"))
            except ImportError as e:  # a machine without matplotlib/plotly (a bare GPU image): the figures stand
                plots = f" (no plots: {e})"
        print(f"wrote {out}{plots}", file=sys.stderr)
    return 130 if status["interrupted"] else (1 if status.get("failed") else 0)


def cmd_generate(args) -> int:
    from mars.decoding.decoder import DecodeConfig, encode_prompt, generate_ids
    from mars.decoding.records import RunRecord
    from mars.models.loading import load

    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code, args.device)
    for w in lm.warnings:
        print(f"warning: {w}", file=sys.stderr)
    say_int8_fallback(lm.model, args.backend)
    block = args.block_size or lm.default_block_size
    cfg = DecodeConfig(
        mode=args.mode, block_size=block, confidence=args.confidence,
        tau=args.tau if args.tau is not None else 0.0 if args.mode == "verified" else 0.9,
        max_tokens_per_pass=args.max_tokens_per_pass, max_new_tokens=args.max_new_tokens,
        cache_block=args.cache_block, use_cache=not args.no_cache, stop_strings=tuple(args.stop),
        temperature=args.temperature, seed=args.seed, verify_groups=args.verify_groups, drafts=args.drafts,
        backend=args.backend, tree_nodes=tree_nodes_arg(args.tree_nodes, lm.model, args.mode),
        tree_groups=args.tree_groups, datastore=args.datastore, **_repeat_tau(args),
    )
    if cfg.datastore:
        from mars.models.datastore import shipped_store

        lm.datastore = shipped_store()  # the table the tree drafts from (None: unreadable, masks and text only)
    prompts = [p for p in args.prompts]
    if any(not p.strip() for p in prompts):
        raise ValueError("empty prompt: give some text to answer")
    ids = [encode_prompt(lm.tokenizer, p, args.system) for p in prompts]
    results: list[RunRecord]
    if args.batch:
        results = generate_ids(lm, ids, cfg)
    else:
        results = [generate_ids(lm, [i], cfg)[0] for i in ids]
    for prompt, res in zip(prompts, results):
        if args.json:
            print(json.dumps({"prompt": prompt, **res.to_dict()}))
        else:
            print(res.text)
            sources = {s.draft_source for s in res.steps} - {None}
            origin = "" if sources <= {"mars"} else ", drafts from " + ", ".join(
                f"{src} in {sum(s.draft_source == src for s in res.steps)} passes" for src in sorted(sources))
            tree = f" tree={cfg.tree_nodes}" if cfg.tree_nodes else ""
            print(
                f"[{cfg.mode}{tree} tau={cfg.tau} B={block}: {res.tokens} tokens in {res.passes} passes, "
                f"{res.tokens_per_pass:.2f} tokens/pass, {res.decode_seconds:.2f} s{origin}]",
                file=sys.stderr,
            )
    return 0


def say_int8_fallback(model, *backends: str) -> None:
    """One line on stderr where a run's int8 matrices will not run on the C kernels (no compiler, a failed
    build, MARS_C_KERNELS=0): the same text, about 2x slower. The build happens here, its own warning held back
    so that the line below is the only one."""
    import warnings

    from mars.runtime import kernels
    from mars.runtime.backends import resolve_backend

    try:
        if not any(resolve_backend(model, b) == "fast-int8" for b in backends):
            return
    except ValueError:
        return  # a backend that cannot run this model: the run itself says so
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        status = kernels.status()
    if status.startswith("tensor fallback"):
        print(f"int8: {status}; about 2x slower than the C kernels", file=sys.stderr)


def tree_nodes_arg(value: str, model, mode: str) -> int:
    """--tree-nodes: a number (DecodeConfig checks it), or 'auto': in verified mode the measured best on the
    model's device (mars.decoding.tree.default_tree_nodes), in other modes 0."""
    from mars.decoding.tree import default_tree_nodes

    if str(value).strip().lower() == "auto":
        return default_tree_nodes(next(model.parameters()).device.type) if mode == "verified" else 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--tree-nodes must be a whole number or 'auto', got {value!r}") from None


def cmd_train(args) -> int:
    from mars.training.train import TrainConfig, train

    cfg = TrainConfig(
        data=args.data[0] if len(args.data) == 1 else args.data, out=args.out, model=args.model, adapter=args.adapter, mask_token=args.mask_token,
        block_size=args.block_size, method=args.method, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
        lr=args.lr, schedule=args.schedule, warmup_ratio=args.warmup_ratio, epochs=args.epochs,
        max_steps=args.max_steps, max_minutes=args.max_minutes, max_cpu_minutes=args.max_cpu_minutes,
        batch_size=args.batch_size, grad_accum=args.grad_accum, max_length=args.max_length, drop_prompt_noisy=not args.keep_prompt_noisy,
        skip_last_slot=args.skip_last_slot, loss_weighting=args.loss_weighting, shift_blocks=args.shift_blocks,
        noisy_copies=args.noisy_copies, select_data=args.select_data, select_limit=args.select_limit,
        select_threshold=args.select_threshold, select_precision=args.select_precision, gated=args.gated, distill=args.distill, save_every=args.save_every, seed=args.seed,
        threads=args.threads, dtype=args.dtype, device=args.device, workers=args.workers,
        autocast=_train_autocast(args.autocast, args.device),
    )
    state = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # one summary line, from the main process
        print(json.dumps({"out": args.out, **state}))
    return 0


def _train_autocast(flag: str | None, device: str) -> str | None:
    """--autocast: as given ('none' turns it off); unset, bfloat16 on CUDA (the default dtype there), none on a CPU."""
    if flag is not None:
        return None if flag == "none" else flag
    from mars.models.device import resolve_device

    return "bfloat16" if resolve_device(device) == "cuda" else None


def cmd_accept(args) -> int:
    """The acceptance lab (mars.evaluation.acceptance_lab): a summary on stderr, the data to --out."""
    import time

    import torch

    from mars.decoding.decoder import encode_prompt
    from mars.evaluation.acceptance_lab import MAX_PROMPTS, ROWS_PER_FORWARD, LabConfig, run_lab, summary_lines, to_csv
    from mars.evaluation.prompt_sets import SETS
    from mars.models.loading import load
    from mars.runtime.backends import resolve_backend

    prompts = list(args.prompts)
    if args.prompt_set is not None:
        if args.prompt_set not in SETS:
            raise ValueError(f"--set must be one of {', '.join(SETS)}, got {args.prompt_set!r}")
        prompts += SETS[args.prompt_set]
    if not prompts or any(not p.strip() for p in prompts):
        raise ValueError("give 1 to 16 non-empty prompts, or --set KIND")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{len(prompts)} prompts given: the lab takes at most {MAX_PROMPTS}")
    if args.out is not None and Path(args.out).suffix not in (".json", ".csv"):
        raise ValueError(f"--out must end in .json or .csv, got {args.out!r}")
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load(args.model, args.adapter, args.mask_token, args.dtype, args.trust_remote_code, args.device)
    for w in lm.warnings:
        print(f"warning: {w}", file=sys.stderr)
    taus = tuple(float(t) for t in args.taus.replace(";", ",").split(",") if t.strip())
    cfg = LabConfig(block_size=args.block_size or lm.default_block_size, max_new_tokens=args.max_new_tokens,
                    tau=args.tau, taus=tuple(t for t in taus if t < 1.0), compare=args.compare, bare_only=args.bare,
                    backend=resolve_backend(lm.model, args.backend),
                    rows_per_forward=args.rows_per_forward or ROWS_PER_FORWARD)
    ids = [encode_prompt(lm.tokenizer, p) for p in prompts]
    describe = {k: lm.describe()[k] for k in ("model", "adapter", "gated", "trained_block_size")}
    t0, result, shown = time.perf_counter(), None, None
    for p in run_lab(lm, prompts, ids, cfg, describe=describe | {"backend": cfg.backend, "threads": torch.get_num_threads()}):
        if p.stage != shown:
            shown = p.stage
            print(f"[{time.perf_counter() - t0:6.1f} s] {p.stage}: {p.note}", file=sys.stderr)
        result = p.result or result
    for line in summary_lines(result):
        print(line, file=sys.stderr)
    print(f"seconds: {json.dumps({k: round(v, 2) for k, v in result['seconds'].items()})}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.write_text(to_csv(result) if out.suffix == ".csv" else json.dumps(result, indent=1), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_settings(args) -> int:
    from mars.settings import markdown_table

    print(markdown_table(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mars.models.loading import LoadError

    try:
        return {"generate": cmd_generate, "train": cmd_train, "bench": cmd_bench, "eval": cmd_eval,
                "calibrate": cmd_calibrate, "accept": cmd_accept, "settings": cmd_settings}[args.command](args)
    except (LoadError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        from mars.models.device import is_oom, oom_message

        if not is_oom(e):
            raise
        print(f"error: {oom_message(OOM_ADVICE[args.command])}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
