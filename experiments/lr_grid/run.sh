#!/usr/bin/env bash
# The v4 studies' learning-rate grid (README.md, issue 59): each scheme at optim.lr in {1e-3, 2e-3, 4e-3, 8e-3} on
# each corpus (data=stdlib, code; data=django_docs, prose), one seed, at the length-extrapolation setting
# (experiment=length_extrapolation: byte level, d = 128, 4 layers, 4 heads, L = 128) and the v4 budget of 1,500 steps.
# The choice reads in-window validation perplexity only: no final evaluation (evaluate_after_fit=false), no
# mid-run evaluation (eval.at=[]), validation on 512 fixed windows (data.val_windows=512) every 250 steps.
# Four sweeps (plain: NoPE, sinusoidal, RoPE, T5, ALiBi, FIRE; fox; irope; rnope_swa), one after another, then the
# extensions README's rule asks for where a choice fell at the grid's end (irope_edge), each in its own folder
# shared by WORKERS workers (default 2) at one thread each under nice 10, from a clean worktree of the commit pinned at the first launch (<root>/COMMIT; ../pinned.sh). A layout arm names its model tiny-<preset>, as in
# experiments/layouts. Relaunch the same command to go on: finished jobs are skipped, an interrupted one resumes from
# its last checkpoint; on a new machine, the runs collected into runs/ (RESTORE, default) are put back first and
# skipped. ARMS narrows the list (ARMS="fox irope").
#   setsid nohup bash experiments/lr_grid/run.sh [root] > /dev/null 2>&1 &    (root: /work/studies/lr_grid)
#   for s in <root>/sweep-*; do python -m pelab.report collect "$s" experiments/lr_grid/runs/${s##*sweep-}; done
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/lr_grid}
RESTORE=${RESTORE-$here/runs}
commit=$(pinned_commit "$root") || exit 2
common=(experiment=length_extrapolation trainer.max_steps=1500 seed=0 data.val_windows=512 evaluate_after_fit=false
        "eval.at=[]" "tags=[lr_grid,v4]")
grid="optim.lr=1e-3,2e-3,4e-3,8e-3 data=stdlib,django_docs"  # before pe=: the sweeps' job order of the first launch
arm_args() {  # <arm>: its train.py arguments besides the common ones
  case $1 in
    plain) echo "$grid pe=nope,sinusoidal,rope,t5_bias,alibi,fire" ;;
    fox) echo "$grid pe=fox" ;;
    irope) echo "$grid pe=rope layout=irope model.name=tiny-irope" ;;
    rnope_swa) echo "$grid pe=rope layout=rnope_swa model.name=tiny-rnope_swa" ;;
    # README's rule for a choice at the grid's end: one rate further on that side (iRoPE on prose chose 8e-3)
    irope_edge) echo "pe=rope layout=irope model.name=tiny-irope optim.lr=1.6e-2 data=django_docs" ;;
  esac
}
# shellcheck disable=SC2086  # ARMS is a list of words
pinned_sweeps "$root" "$commit" ${ARMS:-plain fox irope rnope_swa irope_edge}
