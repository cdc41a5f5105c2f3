#!/usr/bin/env bash
# The context-extension study v4's runs (README.md, issue 59): the methods comparison's streams
# (../../context_extension_methods/run.sh: per seed the RoPE parent at L = 128, its training-free evaluations, the
# fine-tuned children at 512, PoSE and the control arm) on the prose corpus (data=django_docs), the parent at RoPE's
# rate on prose in rates.json (1e-3; CHOICE names another file, e.g. the grid's choice.json), the fine-
# tuned and control arms at half of it (the child preset's ratio: 5e-4 to the parent's 1e-3). SEEDS (default 0-5: the
# first six, after which the pooled sd is re-estimated; then SEEDS="6 7 8 9 10 11" and any top-up to twenty).
# The rate is looked up before the first run: a missing one stops the launch with one line. Relaunch the same command
# to go on; on a new machine the seeds collected into runs/ (RESTORE, default: whole seeds only, the streams that
# launches.log says are done) are put back first and skipped. EXTRA adds train.py arguments to every training job (the GPU plan, README.md). DRY_RUN=1 prints each
# command instead of running it.
# `run.sh along [root]`: the along-training arm (README.md, "Along training", declared 2026-12-07 after the read and
# before its runs): seeds 0-2's streams again, less the training-free evaluations, with every fine-tuned arm and the
# control also evaluated (perplexity and mqar) at a half and three quarters of its steps; into <root>/along, pinned
# there at its first launch (426807c has no eval.at_probes), collected into along/runs. Descriptive.
#   setsid nohup bash experiments/context_extension/v4/run.sh [root] > /dev/null 2>&1 &
#       (root: /work/studies/context_extension_v4; collect and report as ../../context_extension_methods/run.sh says,
#        into experiments/context_extension/v4/runs)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# The parent's rate: 1e-3 (rates.json), not the grid's 0.004, decided before any run (README.md, "Setting"): at the
# grid's rate the retrieval study's 2-layer model never learned mqar, which C2 and C6 measure. CHOICE names another.
CHOICE=${CHOICE:-$here/rates.json}
. "$here/../../pinned.sh"
along=; [ "${1:-}" != along ] || { along=1; shift; }
root=${1:-/work/studies/context_extension_v4}
lr=$(chosen_lr rope django_docs) || exit 2
child_lr=$("$VENV_PY" -c "import sys; print(float(sys.argv[1]) / 2)" "$lr")
if [ -n "$along" ]; then  # its parents are trained again: collect keeps no checkpoint
  RESTORE=${RESTORE-$here/along/runs} FREE= TRAIN_EXTRA="data=django_docs ${EXTRA:-}" \
    PARENT_EXTRA="optim.lr=$lr tags=[context_extension,v4,along]" SEEDS=${SEEDS:-0 1 2} \
    CHILD_EXTRA="optim.lr=$child_lr tags=[context_extension,v4,child,along] eval.at=[0.5,0.75] eval.at_probes=true" \
    exec bash "$here/../../context_extension_methods/run.sh" "$root/along"
fi
RESTORE=${RESTORE-$here/runs} TRAIN_EXTRA="data=django_docs ${EXTRA:-}" PARENT_EXTRA="optim.lr=$lr tags=[context_extension,v4]" \
  CHILD_EXTRA="optim.lr=$child_lr tags=[context_extension,v4,child]" SEEDS=${SEEDS:-0 1 2 3 4 5} \
  exec bash "$here/../../context_extension_methods/run.sh" "$root"
