"""The recipe arms side by side: tokens per forward against the text's quality at each tau, and whether an
arm's speed/quality curve dominates a reference's (the shipped adapter's).

    python -m benchmarks.arms_table --reference v3 runs/compare/v3/eval.json --bare runs/compare/bare/eval.json \
        runs/compare/{control,fresh,shift,weighting,gated} > runs/compare/table.md

Each arm is a folder with eval.json (`python -m mars eval`, the same prompts, taus and token budget for
every arm) and mars.json (its training record), or NAME=EVAL_JSON. Quality columns, per tau:
  NLL x AR    mean NLL of the tau's text under the model's own AR mode / that of its tau 1.0 text
  NLL x bare  mean NLL of the tau's text under the bare model / the bare model's own greedy text's
              (`--bare`: an eval of `--adapter none`, whose tau 1.0 row is that text)
  known       known-answer accuracy at that tau
A curve dominates the reference when every reference point (tokens per forward, NLL x AR) at tau < 1 has
a point of the curve at least as fast and at most as costly (and the curves differ).

`--judge bare` judges both verdicts by NLL x bare instead: one yardstick for every arm. Why: an adapter
that changes the model's own AR mode (merged LoRA) is otherwise judged by a different model than a gated
one, whose AR mode is the bare model. The second verdict, "at ref's speeds", reads the arm's curve at
each reference point's tokens per forward (straight lines between its points, tau 1.0 included) and
counts the reference points it beats (lower NLL there), loses to, and does not reach (faster than the
arm's fastest point): `better/worse/beyond`. Few taus rarely give the point-wise dominance; this says
where along the speed axis one curve is below the other.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mars.decoding.records import stored


def read_arm(spec: str) -> tuple[str, dict, dict]:
    if "=" in spec:
        name, path = spec.split("=", 1)
        return name, json.loads(Path(path).read_text()), {}
    folder = Path(spec)
    meta_path = folder / "mars.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return folder.name, json.loads((folder / "eval.json").read_text()), meta


def points(ev: dict, bare_nll: float | None) -> list[dict]:
    rows = {r["tau"]: r for r in ev["decoding"]}
    ar = rows[1.0]["mean_nll_under_ar"]
    out = []
    for tau in sorted(rows, reverse=True):
        r = rows[tau]
        out.append({
            "tau": tau,
            "tokens_per_pass": stored(r, "tokens_per_pass"),  # older files: tokens_per_forward
            "nll_x_ar": r["mean_nll_under_ar"] / ar,
            "nll_x_bare": (r["mean_nll_under_bare"] / bare_nll) if bare_nll and r.get("mean_nll_under_bare") else None,
            "known": r.get("known_answer_accuracy"),
        })
    return out


def dominates(curve: list[dict], ref: list[dict], key: str = "nll_x_ar") -> bool:
    """Every reference point at tau < 1 is matched or beaten on both axes by some point of `curve`."""
    cp = [(p["tokens_per_pass"], p[key]) for p in curve if p["tau"] < 1.0 and p[key] is not None]
    rp = [(p["tokens_per_pass"], p[key]) for p in ref if p["tau"] < 1.0 and p[key] is not None]
    return bool(rp) and all(any(s >= rs and q <= rq for s, q in cp) for rs, rq in rp) and sorted(cp) != sorted(rp)


def nll_at(curve: list[dict], speed: float, key: str) -> float | None:
    """The curve's NLL at `speed` tokens per forward, on straight lines between its points (None: beyond it)."""
    pts = sorted((p["tokens_per_pass"], p[key]) for p in curve if p[key] is not None)
    if not pts or speed > pts[-1][0]:
        return None
    if speed <= pts[0][0]:
        return pts[0][1]
    for (s0, q0), (s1, q1) in zip(pts, pts[1:]):
        if s0 <= speed <= s1:
            return q0 if s1 == s0 else q0 + (q1 - q0) * (speed - s0) / (s1 - s0)
    return None


def at_ref_speeds(curve: list[dict], ref: list[dict], key: str) -> dict:
    """How the curve compares with each reference point at tau < 1, at that point's tokens per forward."""
    out = {"better": 0, "worse": 0, "beyond": 0}
    for p in ref:
        if p["tau"] >= 1.0 or p[key] is None:
            continue
        q = nll_at(curve, p["tokens_per_pass"], key)
        out["beyond" if q is None else "better" if q < p[key] else "worse"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arms", nargs="+", help="arm folders (eval.json + mars.json) or NAME=EVAL_JSON")
    ap.add_argument("--reference", nargs=2, metavar=("NAME", "EVAL_JSON"), default=None)
    ap.add_argument("--bare", default=None, help="eval.json of the bare model (--adapter none)")
    ap.add_argument("--json", default=None, help="also write every point here")
    ap.add_argument("--judge", choices=("ar", "bare"), default="ar",
                    help="the NLL the verdicts use: each model's own AR mode, or the bare model (needs --bare)")
    args = ap.parse_args()
    if args.judge == "bare" and not args.bare:
        ap.error("--judge bare needs --bare")
    key = f"nll_x_{args.judge}"

    bare_nll = None
    if args.bare:
        bare = json.loads(Path(args.bare).read_text())
        bare_nll = {r["tau"]: r for r in bare["decoding"]}[1.0]["mean_nll_under_ar"]
    arms = [read_arm(s) for s in args.arms]
    if args.reference:
        arms.insert(0, (args.reference[0], json.loads(Path(args.reference[1]).read_text()), {}))
    curves = {name: points(ev, bare_nll) for name, ev, _ in arms}
    ref = curves[args.reference[0]] if args.reference else None

    print(f"| arm | CPU min | sequences | tau | tokens/forward | NLL x AR | NLL x bare | known "
          f"| dominates ref (NLL x {args.judge.upper() if args.judge == 'ar' else 'bare'}) | at ref's speeds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, ev, meta in arms:
        cpu = meta.get("train_cpu_seconds", meta.get("train_seconds"))
        own = ref is None or curves[name] is ref
        dom = "" if own else ("yes" if dominates(curves[name], ref, key) else "no")
        speeds = "" if own else "{better}/{worse}/{beyond}".format(**at_ref_speeds(curves[name], ref, key))
        first = [name, f"{cpu / 60:.0f}" if cpu else "-", str(meta.get("sequences", "-"))]
        for i, p in enumerate(curves[name]):
            cells = (first if i == 0 else ["", "", ""]) + [
                f"{p['tau']:.2f}", f"{p['tokens_per_pass']:.3f}", f"{p['nll_x_ar']:.3f}",
                "-" if p["nll_x_bare"] is None else f"{p['nll_x_bare']:.3f}",
                "-" if p["known"] is None else f"{p['known']:.2f}", dom if i == 0 else "", speeds if i == 0 else ""]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(curves, indent=1))


if __name__ == "__main__":
    main()
