#!/usr/bin/env bash
# Instructions per cached decoding step of a small random Qwen2-VL, stock against a patch (needs valgrind with its
# headers and a C compiler; takes ~10 minutes per state on 2 cores: valgrind runs the imports too).
#   dev/step_instructions/run.sh [SHAPE] [STEPS] [STATE ...]     default: small 8 stock mrope
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"; root="$here/../.."
shape=${1:-small}; steps=${2:-8}; shift $(( $# > 2 ? 2 : $# )); states=("${@:-stock}"); [ $# -eq 0 ] && states=(stock mrope)
work=$(mktemp -d); gcc -O2 -shared -fPIC -o "$work/toggle.so" "$here/toggle.c"
for state in "${states[@]}"; do
  TOGGLE_LIB="$work/toggle.so" PYTHONHASHSEED=0 valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$work/cg.$state" "$root/.venv/bin/python" "$here/step.py" "$shape" "$state" "$steps" \
    >/dev/null 2>&1
  ir=$(sed -n 's/^summary: //p' "$work/cg.$state".1)
  echo "$shape $state: $((ir / steps)) instructions per step"
done
