#!/usr/bin/env bash
# The length-extrapolation study v4's runs (README.md, issue 59): experiment=length_extrapolation at 1,500 steps, each
# scheme on each corpus (data=stdlib, code; data=django_docs, prose) at the learning-rate grid's choice for it
# (experiments/lr_grid/choice.json; CHOICE names another file), one Hydra multirun over the seeds per scheme and corpus
# in <root>/sweep-<scheme>.<corpus>, shared by WORKERS workers (default 2) at one thread each under nice 10, from a
# clean worktree of the commit pinned at the first launch (<root>/COMMIT; ../../pinned.sh).
#   questions    RoPE, ALiBi, NoPE and the RNoPE-SWA layout (the declared questions' schemes), SEEDS (default 0 1 2 3:
#                the first four, after which the pooled sd is re-estimated; then SEEDS="4 5 6 7" and any top-up)
#   descriptive  sinusoidal, T5 bias, FIRE, FoX and the iRoPE layout, seeds 0-2 (SEEDS), no questions
# Every rate is looked up before the first run: a missing one stops the launch with one line. Relaunch the same command
# to go on: finished jobs are skipped, an interrupted one resumes from its last checkpoint; on a new machine the
# runs collected into runs/ (RESTORE, default) are put back first and skipped. EXTRA adds train.py
# arguments to every job (the GPU plan, README.md). DRY_RUN=1 prints each sweep's command instead of running it.
#   setsid nohup bash experiments/length_extrapolation/v4/run.sh questions [root] > /dev/null 2>&1 &
#       (root: /work/studies/length_extrapolation_v4)
#   for c in stdlib django_docs; do for s in <root>/sweep-*.$c; do
#     python -m pelab.report collect "$s" experiments/length_extrapolation/v4/runs/$c; done; done
#   python -m pelab.report experiments/length_extrapolation/v4/runs --questions experiments/length_extrapolation/v4/questions.yaml \
#     --out experiments/length_extrapolation/v4/report      (across: data.source, each corpus its own family)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../pinned.sh"
phase=${1:?"questions or descriptive"}
root=${2:-/work/studies/length_extrapolation_v4}
case $phase in
  questions) schemes="rope alibi nope rnope_swa"; seeds=${SEEDS:-0 1 2 3} ;;
  descriptive) schemes="sinusoidal t5_bias fire fox irope"; seeds=${SEEDS:-0 1 2} ;;
  *) echo "phase: questions or descriptive, not '$phase'" >&2; exit 2 ;;
esac
common=(experiment=length_extrapolation trainer.max_steps=1500 "tags=[length_extrapolation,v4]")
RESTORE=${RESTORE-$here/runs}
# shellcheck disable=SC2086  # the schemes are words
corpus_sweeps "$root" "$seeds" $schemes
