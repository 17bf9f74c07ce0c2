#!/bin/bash
# Runs presets over seeds with the spillway-defaults variant, appending one JSON line per run.
# usage (from a checkout with a prototype diff applied): seeds.sh <hosts> <presets,...> <label> [ENV=value...]
# SEEDS="1 2 3 4" narrows the seeds (default 1-8). Writes <label>.jsonl in the current directory.
here=$(cd "$(dirname "$0")" && pwd)
hosts=$1; presets=$2; label=$3; shift 3
: > "$label.jsonl"
for seed in ${SEEDS:-1 2 3 4 5 6 7 8}; do
  env "$@" node --import tsx "$here/presets.mts" "$hosts" "$seed" spillway "$presets" >> "$label.jsonl"
done
node "$here/summarize.mjs" "$label.jsonl"
