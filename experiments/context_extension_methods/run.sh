#!/usr/bin/env bash
# The context-extension methods smoke comparison (README.md, issue 55). Per seed (0-2), one stream of jobs:
#   parent     experiment=context_extension: the default run (rope, model=recall, byte tokens, a quarter of mqar rows,
#              L = 128, 900 steps), evaluated at 128-2,048 tokens (ppl) and 128 / 512 / 1,024 / 2,048 (mqar)
#   free/<t>   eval.py on the parent's last.ckpt with pe.scaling.type=<t>, factor 16 (configured for the longest
#              length, 16 x L): linear (PI), ntk, yarn, rerope, leaky_rerope, self_extend, string; the same tokens and
#              probe instances as the parent's own evaluation (the "none" row)
#   full/      experiment=context_extension_child, linear and yarn: fine-tuned at 512 (8 rows), 400 steps
#   pose/      experiment=context_extension_pose, linear and yarn: PoSE at 128 reaching 512 (32 rows), 400 steps
#   control/   the child preset at the parent's own length and rows (128, 32 rows), no scaling, 400 steps
#   model.name (a label only) names the arms the report's rows could not tell apart otherwise: recall-pose,
#   recall-control; every other row is "recall" (README.md: the row labels)
# Streams run WORKERS at a time (default 2), each job at one thread under nice 10, from a clean worktree of the commit
# pinned at the first launch (<root>/COMMIT; ../pinned.sh). Relaunch the same command to go on: finished jobs are
# skipped (evaluations by their summary.json, multiruns by the sweep's relaunch rule), an interrupted parent resumes.
# SEEDS, FREE narrow the lists (FREE= empty: no training-free evaluation); TRAIN_EXTRA / EVAL_EXTRA / PARENT_STEPS / CHILD_STEPS are for a dry run of the
# pipeline at toy sizes (README.md: how the script was checked); TRAIN_EXTRA (every training job), PARENT_EXTRA (the
# parent only) and CHILD_EXTRA (the fine-tuned and control arms) also carry another study's settings (the context-
# extension study v4: the corpus and the rates). DRY_RUN=1 prints each command instead of running it.
# Cost, estimated (README.md): about 2.2 CPU-hours, 1.1 h wall at 2 workers on an idle 2-core machine.
#   setsid nohup bash experiments/context_extension_methods/run.sh [root] > /dev/null 2>&1 &   (root: /work/studies/context_extension_methods)
#   python -m pelab.report collect <root>/parents experiments/context_extension_methods/runs/parents
#   for a in free full pose control; do for s in <root>/$a/s*; do
#     python -m pelab.report collect "$s" experiments/context_extension_methods/runs/$a/${s##*/}; done; done
#   python -m pelab.report experiments/context_extension_methods/runs --out experiments/context_extension_methods/report --questions experiments/context_extension_methods/questions.yaml
#   python experiments/context_extension_methods/flops.py experiments/context_extension_methods/runs
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
root=${1:-/work/studies/context_extension_methods}
commit=$(pinned_commit "$root") || exit 2
read -r -a train_extra <<< "${TRAIN_EXTRA:-}"
read -r -a parent_extra <<< "${PARENT_EXTRA:-}"
read -r -a child_extra <<< "${CHILD_EXTRA:-}"
read -r -a eval_extra <<< "${EVAL_EXTRA:-}"
parent_steps=${PARENT_STEPS:+trainer.max_steps=$PARENT_STEPS}
child_steps=${CHILD_STEPS:+trainer.max_steps=$CHILD_STEPS}
launches=$root/launches.log
[ -z "${DRY_RUN:-}" ] || launches=/dev/stdout  # a dry run writes nothing under the root

stream() {  # <seed>: the parent, its training-free evaluations, its fine-tuned children and the control arm, in order
  local s=$1 parent=$root/parents/s$1 log=$root/s$1.log t
  [ -z "${DRY_RUN:-}" ] || log=/dev/stdout
  finished "$parent" || pinned_train "$commit" experiment=context_extension seed="$s" hydra.mode=RUN \
    hydra.run.dir="$parent" ckpt_path=auto ${parent_steps:+"$parent_steps"} "${train_extra[@]}" "${parent_extra[@]}" \
    >> "$log" 2>&1 || return 1
  for t in ${FREE-linear ntk yarn rerope leaky_rerope self_extend string}; do
    finished "$root/free/s$s/$t" || pinned_eval "$commit" ckpt_path="$parent/checkpoints/last.ckpt" \
      pe.scaling.type="$t" pe.scaling.factor=16 logger=csv hydra.run.dir="$root/free/s$s/$t" "${eval_extra[@]}" \
      >> "$log" 2>&1 || return 1
  done
  local child=(extend.from="$parent" seed="$s" extend.eval_before=false ${child_steps:+"$child_steps"}
               "${train_extra[@]}" "${child_extra[@]}")
  pinned_train "$commit" -m experiment=context_extension_child pe.scaling.type=linear,yarn "${child[@]}" \
    hydra.sweep.dir="$root/full/s$s" >> "$log" 2>&1 || return 1
  pinned_train "$commit" -m experiment=context_extension_pose "${child[@]}" model.name=recall-pose \
    hydra.sweep.dir="$root/pose/s$s" >> "$log" 2>&1 || return 1
  pinned_train "$commit" -m experiment=context_extension_child data.seq_len=128 data.batch_size=32 \
    pe.scaling.type=none pe.scaling.factor=1 "${child[@]}" model.name=recall-control \
    hydra.sweep.dir="$root/control/s$s" >> "$log" 2>&1 || return 1
}

echo "$(date -u +%FT%TZ) launch: commit $commit, ${WORKERS:-2} worker(s), seeds ${SEEDS:-0 1 2}" >> "$launches"
# RESTORE (a folder this root's runs were collected into: whole seeds only, for a child or an evaluation needs its
# parent's checkpoint, which collect leaves behind) puts them back first, so that a relaunch on a new machine skips them
restore_runs "$root" || exit 1
for s in ${SEEDS:-0 1 2}; do
  while [ "$(jobs -rp | wc -l)" -ge "${WORKERS:-2}" ]; do wait -n; done
  ( stream "$s" && echo "$(date -u +%FT%TZ) seed $s done" || echo "$(date -u +%FT%TZ) seed $s FAILED: see s$s.log" ) \
    >> "$launches" &
  [ -n "${DRY_RUN:-}" ] || sleep 30  # the next stream starts on its own parent
done
wait
echo "$(date -u +%FT%TZ) all streams ended" >> "$launches"
