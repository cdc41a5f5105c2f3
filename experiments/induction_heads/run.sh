#!/usr/bin/env bash
# The study (README "Running the study"): the three attention rows of Mamba's Table 11 x seeds 0-4 of
# experiment=induction_heads at its stated budget, into one Hydra sweep folder <root>/sweep: per seed, MHA-Abs
# (pe=sinusoidal pe.scale=0.125, its own launch: the scale is a sinusoidal key) then MHA-RoPE and MHA-xPos (one
# multirun), so that after k seeds every row has k. Runs come from a clean git worktree of the commit pinned at the
# first launch (<root>/COMMIT; pinned.sh): a relaunch runs the same code whatever the main checkout holds by then.
# WORKERS (default 1) workers go through the same list at one thread each, nice 10: a job another worker holds (its
# folder's lock) is refused to this one, which goes on to the next. Relaunch the same command to go on: finished jobs
# are skipped (status ok), an interrupted one resumes from its last checkpoint (written every 1,000 steps).
#   setsid nohup bash experiments/induction_heads/run.sh [root] > /dev/null 2>&1 &   (root: /work/studies/induction_heads/study)
#   python -m pelab.report collect <root>/sweep experiments/induction_heads/runs      (the finished run folders)
# SEEDS (default "0 1 2 3 4") and ROWS (default "abs rotary": MHA-Abs, then MHA-RoPE and MHA-xPos) narrow the list,
# e.g. to finish one row first, or to go on when <root>/sweep was lost but some runs are already collected.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/induction_heads/study}
commit=$(pinned_commit "$root")
echo "$(date -u +%FT%TZ) launch: commit $commit, ${WORKERS:-1} worker(s), seeds ${SEEDS:-0 1 2 3 4}, rows ${ROWS:-abs rotary}" >> "$root/launches.log"
worker() {  # <n>
  for s in ${SEEDS:-0 1 2 3 4}; do
    for row in ${ROWS:-abs rotary}; do
      case $row in
        abs) pinned_train "$commit" -m experiment=induction_heads seed=$s pe=sinusoidal pe.scale=0.125 hydra.sweep.dir="$root/sweep" ;;
        rotary) pinned_train "$commit" -m experiment=induction_heads seed=$s pe=rope,xpos hydra.sweep.dir="$root/sweep" ;;
        *) echo "ROWS: unknown row '$row' (abs, rotary)"; return 2 ;;
      esac
    done
  done >> "$root/worker$1.log" 2>&1
}
for w in $(seq 1 "${WORKERS:-1}"); do
  worker "$w" &
  sleep 30  # the next worker starts on the next job
done
wait
echo "$(date -u +%FT%TZ) worker(s) done" >> "$root/launches.log"
