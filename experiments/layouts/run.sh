#!/usr/bin/env bash
# The layouts smoke comparison (README.md, issue 53): plain RoPE and NoPE, and the iRoPE and RNoPE-SWA presets
# (conf/layout/), at the length-extrapolation v3 setting (experiment=length_extrapolation: code corpus, byte level,
# d = 128, 4 layers, 4 heads, L = 128), 1,500 steps, seeds 0-2, perplexity at 1-16 x L on the test split; no
# mid-run evaluations (eval.at=[]). Three sweeps (plain: RoPE and NoPE; irope; rnope_swa), one after another, each in its own folder
# shared by WORKERS workers (default 2) at one thread each under nice 10, from a clean worktree of the commit pinned
# at the first launch (<root>/COMMIT; ../pinned.sh). A layout arm names its model tiny-<preset> (model.name is a
# label: the report's rows and the questions tell the arms apart by it). Relaunch the same command to go on: finished
# jobs are skipped, an interrupted one resumes from its last checkpoint. ARMS narrows the list (ARMS="irope").
# Cost, estimated from v3 (6.4-8.9 min per 1,500-step job on one thread at a load of ~2, evaluation to 8 x L
# included) plus the 16 x L evaluation: about 9-10 min per job, 12 jobs, about 2 CPU-hours (1 h wall at 2 workers).
#   setsid nohup bash experiments/layouts/run.sh [root] > /dev/null 2>&1 &    (root: /work/studies/layouts)
#   for s in <root>/sweep-*; do python -m pelab.report collect "$s" experiments/layouts/runs; done
#   python -m pelab.report experiments/layouts/runs --out experiments/layouts/report --questions experiments/layouts/questions.yaml
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/layouts}
commit=$(pinned_commit "$root")
common=(experiment=length_extrapolation trainer.max_steps=1500 seed=0,1,2 "eval.lengths=[1,2,4,8,16]" "eval.at=[]"
        "tags=[layouts,smoke]")
arm_args() {  # <arm>: its train.py arguments besides the common ones
  case $1 in
    plain) echo "pe=rope,nope" ;;
    irope) echo "pe=rope layout=irope model.name=tiny-irope" ;;
    rnope_swa) echo "pe=rope layout=rnope_swa model.name=tiny-rnope_swa" ;;
  esac
}
# shellcheck disable=SC2086  # ARMS is a list of words
pinned_sweeps "$root" "$commit" ${ARMS:-plain irope rnope_swa}
