"""Keep a training run's adapter in the repository, so that the next session can continue it.

runs/ is not committed and does not survive a session's stop, and a long run is trained in pieces across
sessions. This copies what continuing and charting need (adapter_config.json, mars.json, log.jsonl,
snapshots.jsonl) and writes the LoRA weights in float16: half the bytes of float32 (about 10 MB for r=16
on every matrix of the default model). The trainer and the loader read them back into float32 parameters;
the rounding (relative 2^-11) is printed. The optimizer's moments are not kept (they are 4x the weights):
a continuation with `--adapter DEST` starts a fresh AdamW, and mars.json's history still chains the pieces.

    python -m tools.keep_run runs/r2 data/checkpoints/r2 --note "steps 1-60 float32, then --autocast bfloat16"
    python -m mars train ... --adapter data/checkpoints/r2 --out runs/r2b     # the next piece
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

MAX_MB = 12
WEIGHTS = "adapter_model.safetensors"
COPIED = ("adapter_config.json", "log.jsonl", "snapshots.jsonl")


def keep(run: Path, dest: Path, note: str | None = None) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    from mars.models.loading import MARS_META

    if not (run / WEIGHTS).is_file() or not (run / MARS_META).is_file():
        raise SystemExit(f"{run}: no finished adapter ({WEIGHTS} and {MARS_META}); a run writes them when it stops")
    weights = load_file(str(run / WEIGHTS))
    half = {k: v.to(torch.float16).contiguous() for k, v in weights.items()}
    err = max(float((h.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-12))
              for w, h in zip(weights.values(), half.values()))
    dest.mkdir(parents=True, exist_ok=True)
    save_file(half, str(dest / WEIGHTS), metadata={"format": "pt"})
    mb = (dest / WEIGHTS).stat().st_size / 1e6
    if mb > MAX_MB:
        (dest / WEIGHTS).unlink()
        raise SystemExit(f"{WEIGHTS} would be {mb:.1f} MB in float16 (limit {MAX_MB} MB): keep the repository lean")
    for name in COPIED:
        if (run / name).is_file():
            shutil.copyfile(run / name, dest / name)
    meta = json.loads((run / MARS_META).read_text())
    meta["kept"] = {"from": str(run), "weights_dtype": "float16", "max_relative_rounding": err,
                    **({"note": note} if note else {})}
    (dest / MARS_META).write_text(json.dumps(meta, indent=2))
    return {"dest": str(dest), "mb": round(mb, 2), "tensors": len(half), "max_relative_rounding": err}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a finished run folder (python -m mars train --out)")
    ap.add_argument("dest", help="where to keep it, inside the repository")
    ap.add_argument("--note", default=None, help="recorded in mars.json under kept.note")
    args = ap.parse_args()
    print(json.dumps(keep(Path(args.run), Path(args.dest), args.note)))


if __name__ == "__main__":
    main()
