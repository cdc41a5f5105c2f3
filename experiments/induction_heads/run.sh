#!/usr/bin/env bash
# The study (README "Running the study"): the three attention rows of Mamba's Table 11 (pe=sinusoidal, rope, xpos) x
# seeds 0-4 of experiment=induction_heads at its stated budget: one resumable Hydra multirun in <root>/sweep, seeds
# outermost (after k complete seeds every row has k). It runs from a clean git worktree of the commit pinned at the
# first launch (<root>/COMMIT; pinned.sh), so a relaunch runs the same code whatever the main checkout holds.
# WORKERS (default 1) workers share the sweep folder, one thread each, nice 10: a job held by one is left to it.
# Relaunch the same command to go on: finished jobs are skipped, an interrupted one resumes from its last checkpoint
# (written every 1,000 steps).
#   setsid nohup bash experiments/induction_heads/run.sh [root] > /dev/null 2>&1 &     (root: /work/studies/induction_heads/study)
#   bash experiments/collect.sh <root>/sweep experiments/induction_heads/runs        (the finished run folders)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/pinned.sh"
root=${1:-/work/studies/induction_heads/study}
mkdir -p "$root"
[ -s "$root/COMMIT" ] || git -C "$REPO" rev-parse HEAD > "$root/COMMIT"
commit=$(cat "$root/COMMIT")
echo "$(date -u +%FT%TZ) launch: commit $commit, ${WORKERS:-1} worker(s)" >> "$root/launches.log"
for w in $(seq 1 "${WORKERS:-1}"); do
  pinned_train "$commit" -m experiment=induction_heads seed=0,1,2,3,4 pe=sinusoidal,rope,xpos \
    hydra.sweep.dir="$root/sweep" >> "$root/worker$w.log" 2>&1 &
  sleep 30  # the next worker starts on the next job
done
wait
echo "$(date -u +%FT%TZ) all workers done" >> "$root/launches.log"
