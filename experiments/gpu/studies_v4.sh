#!/usr/bin/env bash
# The v4 studies' GPU plan (issue 59; unrun: no GPU lent). Each v4 study's own run script, unchanged, with its jobs
# sharing the one GPU: WORKERS (default 8) workers, EXTRA="trainer=gpu trainer.precision=bf16-mixed" on every training
# job, the declared seeds in one go (no re-estimate between phases: this is a replicate, reported beside the CPU runs
# and not pooled with them; the claims stay with the CPU runs), each study into <root>/<study>. The rates are the CPU
# studies' (the grid's experiments/lr_grid/choice.json; the retrieval study's second arm and the context extension
# their own rates.json; CHOICE names another file): a missing one stops the launch with one line.
# Relaunch the same command to go on (the studies' scripts skip finished jobs). DRY_RUN=1 prints the commands.
#   bash experiments/gpu/studies_v4.sh [root]      (root: /work/studies/gpu_v4)
# The device machine lacks hydra-core, omegaconf and wandb: they travel as wheels (the v4 READMEs, "The GPU plan").
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/work/studies/gpu_v4}
export WORKERS=${WORKERS:-8} EXTRA="trainer=gpu trainer.precision=bf16-mixed${EXTRA:+ $EXTRA}"
step() { echo "$(date -u +%FT%TZ) gpu_v4: $*" >&2; "$@" || exit $?; }
# the declared seeds of each page (its README, "Seeds"): 8 for the questions' schemes (in each of the retrieval
# study's arms), 3 for the descriptive rows and the along-training arm, 20 for context extension (its re-estimate)
SEEDS="0 1 2 3 4 5 6 7" step bash "$here/length_extrapolation/v4/run.sh" questions "$root/length_extrapolation"
step bash "$here/length_extrapolation/v4/run.sh" descriptive "$root/length_extrapolation"
SEEDS="0 1 2 3 4 5 6 7" step bash "$here/lost_in_the_middle/v4/run.sh" questions "$root/lost_in_the_middle"
step bash "$here/lost_in_the_middle/v4/run.sh" lr1e-3 "$root/lost_in_the_middle"  # its second arm, at 1e-3 (seeds 0-7)
step bash "$here/lost_in_the_middle/v4/run.sh" lr1e-3-descriptive "$root/lost_in_the_middle"
# R1's schemes probed along training, in place of the first arm's descriptive rows (its README, "Along training")
step bash "$here/lost_in_the_middle/v4/run.sh" along "$root/lost_in_the_middle"
SEEDS="$(seq -s ' ' 0 19)" step bash "$here/context_extension/v4/run.sh" "$root/context_extension"
step bash "$here/context_extension/v4/run.sh" along "$root/context_extension"  # its along-training arm (seeds 0-2)
