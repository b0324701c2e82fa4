#!/usr/bin/env bash
# Equal-time recipe comparison for the shipped checkpoint. Each recipe trains for the same CPU time
# (`python -m mars train --max-cpu-minutes`: arms run side by side on shared cores get equal budgets),
# then is scored the cheap way (teacher-forced draft accuracy, one forward per held-out example) and by
# real decoding on 20 prompts (TAUS).
# Resumable: a finished recipe (its eval JSON exists) is skipped; an interrupted one resumes training.
#   MINUTES=20 THREADS=1 bash tools/compare_recipes.sh                 # the first comparison (from scratch)
#   SET=round2 MINUTES=40 THREADS=1 bash tools/compare_recipes.sh      # the data arms, from the shipped adapter
# Env: PYTHON [python3] runs everything.
# round2: control (same data, fixed grid) against fresh model-written prompts, shifted grids and the
# authors' per-sequence weighting, each continuing the shipped adapter with its own recipe (lr 5e-4, B=4,
# last slot skipped), and the gated adapter (from the bare model, as the issue asks). ONLY="a b" runs some arms; several calls with different ONLY run side by side.
set -euo pipefail
# the whole script is one { ... } block, parsed before it runs: editing this file while arms train (they
# run for hours) cannot change what a running copy does next
{
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MINUTES=${MINUTES:-20}
THREADS=${THREADS:-1}
DATA=${DATA:-data/selfdistill/train.jsonl.gz}
OUT=${OUT:-runs/compare}
mkdir -p "$OUT"

# No warmup: the runs stop on time, long before `--epochs 50` ends, and a warmup ratio of that nominal
# length would keep the lr near zero for the whole run (a first attempt lost its comparison that way).
common=(--data "$DATA" --max-cpu-minutes "$MINUTES" --epochs 50 --batch-size 2 --grad-accum 4 --max-length 256
        --save-every 10 --threads "$THREADS" --schedule constant --warmup-ratio 0)
TAUS=${TAUS:-0.9 0.7}
SET=${SET:-first}
declare -A recipes
if [ "$SET" = round2 ]; then
  TAUS=${TAUS_ROUND2:-0.95 0.9 0.8 0.7}
  FRESH=${FRESH:-data/selfdistill/magpie.jsonl.gz}
  shipped="--adapter assets/mars-adapter --block-size 4 --lr 5e-4 --skip-last-slot"
  recipes=(
    [control]="$shipped"
    [fresh]="$shipped --data $DATA $FRESH"
    [shift]="$shipped --shift-blocks"
    [weighting]="$shipped --loss-weighting sequence"
    # the adapter acts at mask rows only (mars.models.gated): a new adapter from the bare model, same shape
    [gated]="--method lora --lora-r 16 --lora-alpha 32 --block-size 4 --lr 5e-4 --skip-last-slot --gated"
  )
else recipes=(
  [lora_b4]="--method lora --lora-r 16 --lora-alpha 32 --lr 2e-4 --block-size 4"
  [lora_b4_skiplast]="--method lora --lora-r 16 --lora-alpha 32 --lr 2e-4 --block-size 4 --skip-last-slot"
  [lora_b3]="--method lora --lora-r 16 --lora-alpha 32 --lr 2e-4 --block-size 3 --skip-last-slot"
  [lora_b4_lr5e4]="--method lora --lora-r 16 --lora-alpha 32 --lr 5e-4 --block-size 4 --skip-last-slot"
  [full_b4]="--method full --lr 3e-5 --block-size 4 --skip-last-slot"
); fi
for name in ${ONLY:-${!recipes[@]}}; do
  dir="$OUT/$name"
  [ -f "$dir/eval.json" ] && { echo "skip $name (done)"; continue; }
  # shellcheck disable=SC2086
  "$PY" -m mars train "${common[@]}" ${recipes[$name]} --out "$dir" 2>>"$dir.log" | tail -1
  adapter="$dir"; model=()
  if [ -d "$dir/model" ]; then adapter=none; model=(--model "$dir/model"); fi
  "$PY" -m mars eval "${model[@]}" --adapter "$adapter" --limit 20 --taus $TAUS --max-new-tokens 48 \
    --known-limit 20 --threads "$THREADS" --out "$dir/eval.json" 2>>"$dir.log" | tail -3
done
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| recipe | CPU min | seqs | acc d2 | acc d3 | est tok/pass | tok/fwd tau .9 | tok/fwd tau .7 | NLL tau .9 | known tau .9 |")
print("|---|---|---|---|---|---|---|---|---|---|")
for d in sorted(p for p in out.iterdir() if (p / "eval.json").is_file() and (p / "mars.json").is_file()):
    ev = json.loads((d / "eval.json").read_text()); meta = json.loads((d / "mars.json").read_text())
    acc = ev["draft_accuracy"]["accuracy_by_distance"]; dec = {r["tau"]: r for r in ev["decoding"]}
    print(f"| {d.name} | {meta.get('train_cpu_seconds', meta['train_seconds'])/60:.0f} | {meta['sequences']} | {acc.get('2', 0):.2f} | {acc.get('3', 0):.2f} "
          f"| {ev['draft_accuracy']['est_tokens_per_pass']:.2f} | {dec[0.9].get('tokens_per_pass', dec[0.9].get('tokens_per_forward')):.3f} | {dec[0.7].get('tokens_per_pass', dec[0.7].get('tokens_per_forward')):.3f} "
          f"| {dec[0.9]['mean_nll_under_ar']:.3f} | {dec[0.9].get('known_answer_accuracy', 0):.2f} |")
EOF
exit
}
