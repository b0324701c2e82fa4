"""The repeat guard on and off, side by side: tokens per pass, NLL under the bare model and stutters per tau,
and each guarded point against the unguarded curve at the same tokens per pass.

    for rt in off 1.0 0.99; do
      python -m mars eval --limit 20 --max-new-tokens 48 --threads 2 --known '' \
          --taus 0.95 0.9 0.8 0.7 0.5 --repeat-tau $rt --out runs/stutter/eval_rt$rt.json
    done
    python -m benchmarks.stutter_table --reference off=runs/stutter/eval_rtoff.json \
        guard1.0=runs/stutter/eval_rt1.0.json guard0.99=runs/stutter/eval_rt0.99.json

Every file must come from the same prompts, token budget and adapter. Columns, per tau:
  NLL x bare   mean NLL of the tau's text under the bare model / that of the bare model's own greedy text
               (the tau 1.0 row of a gated adapter, whose AR mode is the bare model: arms_table --judge bare)
  stutter      words repeated back to back that the tau 1.0 text of the same prompt does not repeat, per 100
               words, and the share of texts with at least one (mars.evaluation.quality.stutter_rate)
  guard stops  passes whose chain the repeat guard cut
  off at speed the reference (guard off) curve's NLL x bare at this point's tokens per pass (straight lines
               between its points, tau 1.0 included; "-" past its fastest point): lower NLL x bare than
               this at equal tokens per pass means the guard helps there
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.arms_table import nll_at


def curve(paths: str) -> list[dict]:
    """One setting's points; PATHS may be several evals of the same setting, comma-separated (one tau each,
    run in parallel): their rows are merged by tau."""
    by_tau = {r["tau"]: r for path in paths.split(",") for r in json.loads(Path(path).read_text())["decoding"]}
    rows = sorted(by_tau.values(), key=lambda r: -r["tau"])
    base = next(r for r in rows if r["tau"] == 1.0)["mean_nll_under_bare"]
    return [{"tau": r["tau"], "repeat_tau": r.get("repeat_tau"), "tokens_per_pass": r["tokens_per_pass"],
             "nll_x_bare": r["mean_nll_under_bare"] / base, "stutter": r.get("stutter") or {},
             "guard_stops": r.get("repeat_guard_stops", 0)} for r in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arms", nargs="*", help="NAME=EVAL_JSON[,EVAL_JSON...]: guard settings to compare with the reference")
    ap.add_argument("--reference", required=True, help="NAME=EVAL_JSON[,EVAL_JSON...]: the guard off")
    ap.add_argument("--json", default=None, help="also write every point here")
    args = ap.parse_args(argv)
    specs = [args.reference] + args.arms
    if any("=" not in s for s in specs):
        ap.error("give each eval as NAME=EVAL_JSON")
    curves = {name: curve(paths) for name, paths in (s.split("=", 1) for s in specs)}
    ref = curves[args.reference.split("=", 1)[0]]
    print("| setting | tau | tokens/pass | NLL x bare | off at speed | stutter /100 words | texts with stutter "
          "| guard stops |")
    print("|---|---|---|---|---|---|---|---|")
    for name, points in curves.items():
        for i, p in enumerate(points):
            off = nll_at(ref, p["tokens_per_pass"], "nll_x_bare") if points is not ref else None
            s = p["stutter"]
            print("| " + " | ".join([
                name if i == 0 else "", f"{p['tau']:.2f}", f"{p['tokens_per_pass']:.3f}", f"{p['nll_x_bare']:.3f}",
                "" if points is ref else "-" if off is None else f"{off:.3f}",
                f"{s.get('per_100_words', 0):.2f}", f"{s.get('texts_with_stutter', 0):.2f}", str(p["guard_stops"]),
            ]) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(curves, indent=1))


if __name__ == "__main__":
    main()
