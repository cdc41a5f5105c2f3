#!/usr/bin/env bash
# Copy the small files of finished run folders (summary.json, csv/metrics.csv, .hydra/overrides.yaml, the diff of a
# launch from a dirty tree: provenance-<launch>.diff) from a sweep
# folder into the repository: what the reports and the findings are made from. Unfinished jobs are left out (a
# relaunch of the sweep finishes them; run this again).
#   bash experiments/collect.sh <sweep folder> <destination under experiments/>
set -eu
src=$1; dst=$2
mkdir -p "$dst"
for job in "$src"/*/; do
  [ -f "$job/summary.json" ] || continue
  python3 -c "import json,sys; sys.exit(0 if json.load(open('$job/summary.json'))['status'] == 'ok' else 1)" || continue
  name=$(basename "$job")
  mkdir -p "$dst/$name/csv" "$dst/$name/.hydra"
  cp "$job/summary.json" "$dst/$name/"
  [ -f "$job/csv/metrics.csv" ] && cp "$job/csv/metrics.csv" "$dst/$name/csv/"
  [ -f "$job/.hydra/overrides.yaml" ] && cp "$job/.hydra/overrides.yaml" "$dst/$name/.hydra/"
  for diff in "$job"/provenance-*.diff; do [ -f "$diff" ] && cp "$diff" "$dst/$name/"; done
done
echo "collected $(ls -d "$dst"/*/ 2>/dev/null | wc -l) finished jobs into $dst"
