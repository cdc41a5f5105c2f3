#!/usr/bin/env bash
# Study v3 (experiments/length_extrapolation/v3/README.md): the main sweep, then the learning-rate check, then the
# model.init check, each a resumable multirun shared by two workers at one thread each (2-core CPU). Relaunch
# the same command to go on after an interruption: finished jobs are skipped, interrupted ones resumed.
#   bash experiments/length_extrapolation/v3/run.sh [root folder of the sweeps, default outputs/studies/v3]
set -u
root=${1:-outputs/studies/v3}
mkdir -p "$root"
sweep() {  # <name> <overrides...>: two workers on one sweep folder
  local name=$1; shift
  for w in 1 2; do
    OMP_NUM_THREADS=1 python train.py experiment=length_extrapolation "$@" hydra.sweep.dir="$root/$name" \
      >> "$root/$name.worker$w.log" 2>&1 &
    sleep 30  # the second worker starts on the next job
  done
  wait
}
sweep main
sweep lr trainer.max_steps=1500 seed=0 optim.lr=1e-3,4e-3
sweep init model.init=kaiming pe=rope,alibi seed=0,1
