#!/usr/bin/env bash
# The along-training curve of one run (README "Measurements"). The learning rate is constant, so the run extended to a
# larger trainer.max_steps (a relaunch into its folder with ckpt_path=auto) is the longer run, step for step; after
# each extension the run's own end-of-training evaluation scores the probes at 2^6 ... 2^11 (256 instances each)
# and its summary.json is kept as curve/summary-<step>.json. One thread, nice 10, from a clean worktree of <commit>.
# Rerun the same command to continue.
#   bash experiments/induction_heads/curve.sh <commit> <run folder> "<steps ...>" [train.py overrides ...]
set -u
. "$(dirname "$0")/../pinned.sh"
commit=$1; dir=$2; steps=$3; shift 3
mkdir -p "$dir/curve"
for s in $steps; do
  [ -f "$dir/curve/summary-$s.json" ] && continue
  pinned_train "$commit" experiment=induction_heads "$@" trainer.max_steps="$s" ckpt_path=auto hydra.run.dir="$dir" \
    probes.lengths=[0.25,0.5,1,2,4,8] probes.samples=256 >> "$dir/curve.log" 2>&1 \
    || { echo "step $s failed: $dir/curve.log"; exit 1; }
  cp "$dir/summary.json" "$dir/curve/summary-$s.json"
done
