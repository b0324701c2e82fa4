"""The GPU check's report: one table from the bench runs and the training throughput run of one
`tools/gpu_check.sh` call, printed and written as JSON. Every figure comes from that call's own files.

    python -m tools.gpu_report --bench OUT/bench_b1.json OUT/bench_b8.json --train OUT/train --out OUT/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAMES = {"ar": "core AR", "hf": "transformers generate", "mars": "MARS tau {tau:g}",
         "verified": "verified (a group per outcome)", "verified_last": "verified (one group, last)",
         "verified_lookup": "verified, lookup drafts", "verified_both": "verified, both draft sources",
         "lookup": "transformers prompt lookup", "jacobi": "Jacobi"}


def bench_rows(data: dict) -> list[dict]:
    """One row per (batch size, method): tokens/s, tokens/pass, speed against core AR in the same run."""
    rows = []
    for r in data["runs"]:
        base, _, nodes = r["method"].partition(":")  # verified_tree:16
        name = (f"verified tree, {nodes} nodes" if base.startswith("verified_tree") else
                NAMES.get(r["method"], r["method"]).format(tau=r["tau"] if r["tau"] is not None else 0))
        rows.append({"batch": r["batch_size"], "method": name, "key": r["method"], "tau": r["tau"],
                     "prompts": r["prompts"], "tokens": r["new_tokens"], "tokens_per_s": round(r["tokens_per_s"], 1),
                     "tokens_per_pass": round(r["tokens_per_pass"], 3), "vs_core_ar": round(r["speedup_vs_ar"], 3),
                     "exact_vs_ar": r["exact_match_with_ar"], "interrupted": r["interrupted"]})
    verified = [x for x in rows if x["key"] in ("verified", "verified_last")]
    for bs in {x["batch"] for x in verified}:  # the best verified setting of this run, at each batch size
        best = max((x for x in verified if x["batch"] == bs), key=lambda x: x["tokens_per_s"])
        best["best_verified"] = True
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"{'batch':>5}  {'method':<34}{'tokens/s':>10}{'tokens/pass':>13}{'vs core AR':>12}{'= AR':>7}"
    lines = [head, "-" * len(head)]
    for x in rows:
        best = " *" if x.get("best_verified") else ""
        cut = " (interrupted)" if x["interrupted"] else ""
        lines.append(f"{x['batch']:>5}  {x['method'] + best:<34}{x['tokens_per_s']:>10.1f}{x['tokens_per_pass']:>13.2f}"
                     f"{x['vs_core_ar']:>11.2f}x{x['exact_vs_ar']:>7.2f}{cut}")
    lines.append("* the faster verified setting in this run; '= AR': share of prompts whose text equals core AR's")
    return "\n".join(lines)


def train_summary(folder: Path, stdout: Path | None = None) -> dict:
    """Throughput after the first steps, from the run's log; device and workers as the run resolved them
    (its last stdout line), else as asked (mars.json's recipe)."""
    from mars.training.phases import throughput

    rows = [json.loads(x) for x in (folder / "log.jsonl").read_text().splitlines() if x.strip()]
    meta = json.loads((folder / "mars.json").read_text()) if (folder / "mars.json").is_file() else {}
    recipe = meta.get("recipe", {})
    out = throughput(rows, skip=min(3, len(rows) - 1))  # the first steps pay one-off costs
    out.update({"batch_size": recipe.get("batch_size"), "max_length": recipe.get("max_length"),
                "lora_r": recipe.get("lora_r"), "autocast": recipe.get("autocast"),
                "workers": recipe.get("workers"), "device": recipe.get("device"), "all_steps": len(rows)})
    lines = stdout.read_text().strip().splitlines() if stdout is not None and stdout.is_file() else []
    if lines and lines[-1].startswith("{"):
        done = json.loads(lines[-1])
        out.update({k: done[k] for k in ("device", "workers") if k in done})
    return out


def format_train(t: dict) -> str:
    ms = ", ".join(f"{k} {v:.0f} ms" for k, v in t["ms_per_step"].items())
    return (f"training on {t['device']} (gated, batch {t['batch_size']}, max length {t['max_length']}, LoRA r {t['lora_r']}, autocast "
            f"{t['autocast']}, {t['workers']} workers): {t['sequences_per_s']} sequences/s, {t['steps_per_s']} steps/s "
            f"over {t['steps']} steps after the first {t['all_steps'] - t['steps']}\n  per step: {ms}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", nargs="*", default=[], help="bench JSON files of this run")
    ap.add_argument("--train", default=None, help="the throughput run's --out folder")
    ap.add_argument("--train-stdout", default=None, help="the throughput run's stdout (its summary line)")
    ap.add_argument("--sdpa", default=None, help="benchmarks/sdpa_probe.py's JSON line")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    report = {"note": args.note, "bench": [], "machine": None, "train": None, "missing": []}
    for path in args.bench:
        p = Path(path)
        if not p.is_file():
            report["missing"].append(f"{path}: the bench wrote nothing (see its log)")
            continue
        data = json.loads(p.read_text())
        report["machine"] = report["machine"] or {**data["machine"], "model": data["model"], "adapter": data["adapter"],
                                                  "max_new_tokens": data["max_new_tokens"]}
        report["bench"] += bench_rows(data)
    if report["machine"]:
        m = report["machine"]
        print(f"{m.get('gpu') or m['cpu']} ({m['device']}, {m['dtype']}), {m['model']} + {m['adapter'] or 'no adapter'}, "
              f"{m['max_new_tokens']} new tokens, torch {m['torch']}")
    if report["bench"]:
        print(format_rows(report["bench"]))
    if args.train:
        try:
            report["train"] = train_summary(Path(args.train), args.train_stdout and Path(args.train_stdout))
            print(format_train(report["train"]))
        except (OSError, ValueError, KeyError) as e:
            report["missing"].append(f"training: {e}")
    if args.sdpa and Path(args.sdpa).is_file() and Path(args.sdpa).read_text().strip():
        report["sdpa"] = json.loads(Path(args.sdpa).read_text().strip().splitlines()[-1])
        print("SDPA kernels for the training forward (" + report["sdpa"]["attn_implementation"] + "): " +
              ", ".join(f"{k} {v}" for k, v in report["sdpa"]["kernels"].items()))
    for m in report["missing"]:
        print(f"missing: {m}", file=sys.stderr)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    return 1 if report["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
