#!/usr/bin/env bash
# The data-dependent positions smoke comparison (README.md, issue 54; its runs are committed in runs/): RoPE, FoX,
# FoX + RoPE and stick-breaking attention (pe=nope) on the main job's setting (`python train.py`: model=recall, d 128, 2 layers,
# 2 heads of 64; bytes of the Python standard library, a quarter of the rows mqar; L = 128; 900 steps), seeds 0-2,
# perplexity at 1-16 x L and mqar by depth x length (1-8 x L) on the test split. Three sweeps (plain: RoPE and FoX;
# fox_rope; stickbreaking), one after another, each in its own folder shared by WORKERS workers (default 2) at one
# thread each under nice 10, from a clean worktree of the commit pinned at the first launch (<root>/COMMIT;
# ../pinned.sh). The arms that share a pe name are told apart by model.name (a label): recall-fox_rope,
# recall-stickbreaking. Relaunch the same command to go on: finished jobs are skipped, an interrupted one resumes.
# ARMS narrows the list (ARMS="stickbreaking").
# Cost: 12 jobs, about 2 h wall at 2 workers on the 2-core VM beside other work (load 3-9; README.md).
#   setsid nohup bash experiments/data_dependent/run.sh [root] > /dev/null 2>&1 &    (root: /work/studies/data_dependent)
#   for s in <root>/sweep-*; do python -m pelab.report collect "$s" experiments/data_dependent/runs; done
#   python -m pelab.report experiments/data_dependent/runs --out experiments/data_dependent/report \
#     --questions experiments/data_dependent/questions.yaml
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/data_dependent}
commit=$(pinned_commit "$root")
common=(seed=0,1,2 logger=csv "eval.lengths=[1,2,4,8,16]" "tags=[data_dependent,smoke]")
arm_args() {  # <arm>: its train.py arguments besides the common ones
  case $1 in
    plain) echo "pe=rope,fox" ;;
    fox_rope) echo "pe=fox pe.rope=true model.name=recall-fox_rope" ;;
    stickbreaking) echo "pe=nope model.attention=stickbreaking model.name=recall-stickbreaking" ;;
  esac
}
# shellcheck disable=SC2086  # ARMS is a list of words
pinned_sweeps "$root" "$commit" ${ARMS:-plain fox_rope stickbreaking}
