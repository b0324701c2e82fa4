"""Acceptance against training CPU-hours: gather teacher-forced (and, where measured, decoding) evaluations
of a checkpoint's successive pieces and snapshots into one JSON list for the model card and its plot.

    python -m tools.curve --point v0 runs/v0/tf100.json 1.26 --point v2 runs/v2/tf100.json 3.1 \
        --decoding v2 runs/v2/eval.json --out runs/curve.json
    python -m tools.curve --previous assets/mars-adapter/curve.json --point v4 runs/tf/v4.json 7.9 --out runs/curve.json
    python -m tools.curve --previous assets/mars-adapter/curve.json --point r2 runs/r2/tf100.json 2.5 \
        --decoding r2 runs/r2/eval.json --branch r2 "gated r2" --out runs/curve.json      # an arm off the chain

Each --point is NAME TF_JSON CPU_HOURS: TF_JSON is `python -m mars eval --teacher-forced-only --out` for
that checkpoint (the same --limit for every point, or the points are not comparable); CPU_HOURS is its
cumulative training time (mars.json `total.cpu_seconds` / 3600). --decoding NAME EVAL_JSON adds the
real tokens per forward at each tau of a full `python -m mars eval`, with the text's quality there (NLL under
the model in AR mode and under the bare model, known-answer accuracy; tau 1.0 included as the reference).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mars.decoding.records import stored


QUALITY = ("mean_nll_under_ar", "mean_nll_under_bare", "known_answer_accuracy")


def build(points: list[tuple[str, str, float]], decoding: dict[str, str], previous: list[dict] = (),
          branches: dict[str, str] | None = None) -> list[dict]:
    """previous: rows of an earlier curve (the shipped adapter's curve.json), kept as they are. branches:
    NAME -> label for points off the shipped chain (another recipe; the plot draws them as lone markers)."""
    branches = branches or {}
    out, examples = list(previous), {r.get("examples") for r in previous}
    for name, path, hours in points:
        rep = json.loads(Path(path).read_text())
        examples.add(rep.get("examples"))
        da = rep["draft_accuracy"]
        row = {"name": name, "cpu_hours": float(hours), "examples": rep.get("examples"),
               "est_tokens_per_pass": da["est_tokens_per_pass"],
               "accuracy_by_distance": {str(k): v for k, v in da["accuracy_by_distance"].items()}}
        if name in branches:
            row["branch"] = branches[name]
        if name in decoding:
            rep_dec = json.loads(Path(decoding[name]).read_text())
            dec = rep_dec["decoding"]
            if rep_dec.get("examples") is not None:  # decoding figures from how many prompts
                row["decoding_examples"] = rep_dec["examples"]
            row["tokens_per_pass"] = {f"{r['tau']:g}": stored(r, "tokens_per_pass") for r in dec if r["tau"] < 1.0}
            # what those tokens cost: more tokens per forward is no gain if the text got worse
            row["quality"] = {f"{r['tau']:g}": {k: r.get(k) for k in QUALITY} for r in dec}
        out.append(row)
    if len(examples) > 1:
        raise SystemExit(f"points were evaluated on different numbers of examples: {sorted(examples)}")
    return sorted(out, key=lambda r: r["cpu_hours"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", nargs=3, action="append", metavar=("NAME", "TF_JSON", "CPU_HOURS"), required=True)
    ap.add_argument("--decoding", nargs=2, action="append", default=[], metavar=("NAME", "EVAL_JSON"))
    ap.add_argument("--branch", nargs=2, action="append", default=[], metavar=("NAME", "LABEL"),
                    help="mark point NAME as an arm off the shipped chain, labelled LABEL in the plot")
    ap.add_argument("--previous", default=None,
                    help="an earlier curve JSON (assets/mars-adapter/curve.json): its points are kept, since the "
                         "evaluations behind them do not outlive a session")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    previous = json.loads(Path(args.previous).read_text()) if args.previous else []
    rows = build([(n, p, float(h)) for n, p, h in args.point], dict(args.decoding), previous, dict(args.branch))
    Path(args.out).write_text(json.dumps(rows, indent=2))
    for r in rows:
        print(f"{r['name']:<12}{r['cpu_hours']:6.2f} h  est {r['est_tokens_per_pass']:.3f}  "
              + "  ".join(f"d{d} {a:.3f}" for d, a in r["accuracy_by_distance"].items())
              + "".join(f"  tau {t}: {v:.3f}" for t, v in stored(r, "tokens_per_pass", {}).items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
