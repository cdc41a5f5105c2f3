#!/usr/bin/env bash
# The corpora study (README.md): RoPE and ALiBi on Django's documentation at the length-extrapolation v3 setting
# (experiment=length_extrapolation, 1,500 steps), seeds 0-2, one Hydra multirun shared by WORKERS workers (default
# 2) at one thread each under nice 10, from a clean worktree of the commit pinned at the first launch
# (<root>/COMMIT; ../pinned.sh). Relaunch the same command to go on: finished jobs are skipped, an interrupted one
# resumes from its last checkpoint.
#   setsid nohup bash experiments/corpora/run.sh [root] > /dev/null 2>&1 &    (root: /work/studies/corpora)
#   python -m pelab.report collect <root>/sweep experiments/corpora/runs
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/corpora}
commit=$(pinned_commit "$root")
echo "$(date -u +%FT%TZ) launch: commit $commit, ${WORKERS:-2} worker(s)" >> "$root/launches.log"
for w in $(seq 1 "${WORKERS:-2}"); do
  pinned_train "$commit" -m experiment=length_extrapolation data=django_docs pe=rope,alibi seed=0,1,2 \
    trainer.max_steps=1500 "tags=[length_extrapolation,v3,django_docs]" hydra.sweep.dir="$root/sweep" \
    >> "$root/worker$w.log" 2>&1 &
  sleep 30  # the next worker starts on the next job
done
wait
echo "$(date -u +%FT%TZ) worker(s) done" >> "$root/launches.log"
