#!/usr/bin/env bash
# The lost-in-the-middle study v4's runs (README.md, issue 59): experiment=lost_in_the_middle (v3's recipe: model=recall,
# 1,000 steps, probes by depth x length at 1-8 x L) with the default run's mix of text and mqar rows (a quarter mqar
# from step 400), each scheme on each corpus
# (data=stdlib, code; data=django_docs, prose) at the learning-rate grid's choice for it (experiments/lr_grid/
# choice.json; CHOICE names another file), one Hydra multirun over the seeds per scheme and corpus in
# <root>/sweep-<scheme>.<corpus>, shared by WORKERS workers (default 2) at one thread each under nice 10, from a clean
# worktree of the commit pinned at the first launch (<root>/COMMIT; ../../pinned.sh).
#   questions    RoPE, ALiBi, FIRE and NoPE (the declared questions' schemes), SEEDS (default 0 1 2 3: the first four,
#                after which the pooled sd is re-estimated; then SEEDS="4 5 6 7" and any top-up)
#   lr1e-3       the second arm, declared after the first arm's seeds 0-3 (README.md): the same schemes and questions
#                at one shared rate, 1e-3 (lr1e-3/rates.json), seeds 0-7 (SEEDS), into <root>/lr1e-3, same commit
#   lr1e-3-descriptive  the descriptive rows in the second arm: sinusoidal, T5 bias and FoX at 1e-3, seeds 0-2
#   descriptive  sinusoidal, T5 bias and FoX, seeds 0-2 (SEEDS), no questions
#   fox-gate     FoX at 1e-3 with its forget gates' bias at 5 (x-transformers' start) instead of 0 (the reference's),
#                seeds 0-2, into <root>/fox_gate at the second arm's commit: does the start decide whether it learns mqar?
#   along        the along-training arm (README.md, declared 2026-12-07 before its runs): RoPE and ALiBi at 1e-3
#                (lr1e-3/rates.json), seeds 0-2 (SEEDS), with the probes at a half and three quarters of training
#                (eval.at=[0.5,0.75] eval.at_probes=true): whether R1's ordering still moved when training stopped; no
#                verdict. Into <root>/along, pinned there at its first launch (the first arm's 2c9aaff has no
#                eval.at_probes), collected into along/runs
#   ruler        the six RULER-style kinds at their minimum difficulty for each question scheme, seed 0, code corpus, at
#                the kinds' own preset rate (experiments/ruler/run.sh with PE=<scheme>, into <root>/ruler, same commit),
#                WORKERS streams of schemes side by side
# Every rate is looked up before the first run: a missing one stops the launch with one line. Relaunch the same command
# to go on: finished jobs are skipped, an interrupted one resumes; on a new machine the runs collected into runs/
# (RESTORE, default) are put back first and skipped. EXTRA adds train.py arguments to every job (the GPU
# plan, README.md). DRY_RUN=1 prints each command instead of running it.
#   setsid nohup bash experiments/lost_in_the_middle/v4/run.sh questions [root] > /dev/null 2>&1 &
#       (root: /work/studies/lost_in_the_middle_v4)
#   for c in stdlib django_docs; do for s in <root>/sweep-*.$c; do
#     python -m pelab.report collect "$s" experiments/lost_in_the_middle/v4/runs/$c; done; done
#   python -m pelab.report experiments/lost_in_the_middle/v4/runs --questions experiments/lost_in_the_middle/v4/questions.yaml \
#     --out experiments/lost_in_the_middle/v4/report      (across: data.source, each corpus its own family)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../../pinned.sh"
phase=${1:?"questions, lr1e-3, descriptive, lr1e-3-descriptive, fox-gate, along or ruler"}
root=${2:-/work/studies/lost_in_the_middle_v4}
question_schemes="rope alibi fire nope" descriptive_schemes="sinusoidal t5_bias fox"
pin_under() {  # <sub>: root becomes <root>/<sub>, pinned to the study's commit (the first arm's) in its own COMMIT
  commit=$(pinned_commit "$root") || exit 2
  root=$root/$1
  [ -n "${DRY_RUN:-}" ] || { mkdir -p "$root"; [ -s "$root/COMMIT" ] || echo "$commit" > "$root/COMMIT"; }
}
case $phase in
  questions) schemes=$question_schemes; seeds=${SEEDS:-0 1 2 3} ;;
  descriptive) schemes=$descriptive_schemes; seeds=${SEEDS:-0 1 2} ;;
  lr1e-3|lr1e-3-descriptive)  # the second arm (README.md) at one shared rate, 1e-3 (lr1e-3/rates.json, not the
    # grid's choice): the questions' schemes, seeds 0-7, or the descriptive rows, seeds 0-2; into <root>/lr1e-3 at the
    # first arm's pinned commit, collected into lr1e-3/runs
    if [ "$phase" = lr1e-3 ]; then schemes=$question_schemes; seeds=${SEEDS:-0 1 2 3 4 5 6 7}
    else schemes=$descriptive_schemes; seeds=${SEEDS:-0 1 2}; fi
    tags="[lost_in_the_middle,v4,lr1e-3]"
    CHOICE=$here/lr1e-3/rates.json; RESTORE=${RESTORE-$here/lr1e-3/runs}
    pin_under lr1e-3 ;;
  fox-gate)  # README.md, "FoX's gate at x-transformers' start" (declared 2026-12-07 before its runs): the second arm's
    # FoX row again with the forget gates' bias at 5 (f = 0.993 at the start) instead of the reference's 0 (f = 1/2),
    # seeds 0-2 (SEEDS), into <root>/fox_gate at the second arm's commit, collected into fox_gate/runs
    schemes=fox; seeds=${SEEDS:-0 1 2}; tags="[lost_in_the_middle,v4,lr1e-3,fox_gate]"
    CHOICE=$here/lr1e-3/rates.json; RESTORE=${RESTORE-$here/fox_gate/runs}
    pin_under fox_gate
    EXTRA="pe.gate_bias_init=5.0 ${EXTRA:-}" ;;
  along)  # README.md, "Along training": R1's schemes at the second arm's rate, evaluated during training too
    schemes="rope alibi"; seeds=${SEEDS:-0 1 2}; tags="[lost_in_the_middle,v4,along]"
    CHOICE=$here/lr1e-3/rates.json; RESTORE=${RESTORE-$here/along/runs}
    root=$root/along  # its own COMMIT (pinned_commit in corpus_sweeps): HEAD at its first launch
    EXTRA="eval.at=[0.5,0.75] eval.at_probes=true ${EXTRA:-}" ;;
  ruler)  # the study's commit (on a new machine: the one its collected runs ran), its runs collected into ruler/runs
    commit=$(RESTORE=${RESTORE-$here/runs} pinned_commit "$root")
    [ -n "${DRY_RUN:-}" ] || { mkdir -p "$root/ruler"; [ -s "$root/ruler/COMMIT" ] || echo "$commit" > "$root/ruler/COMMIT"; }
    # ruler/run.sh trains its kinds one at a time: WORKERS streams (default 2) each take every WORKERS-th scheme, so
    # no core sits idle. The collected runs go back and the worktree is made once, before the streams start.
    RESTORE=$here/ruler/runs restore_runs "$root/ruler" || exit 1
    [ -n "${DRY_RUN:-}" ] || pinned_tree "$commit" > /dev/null || exit 1
    workers=${WORKERS:-2}; [ -z "${DRY_RUN:-}" ] || workers=1  # a dry run prints its commands in order
    pids=()
    for w in $(seq 0 $((workers - 1))); do
      (
        i=0
        for scheme in $question_schemes; do
          [ $((i++ % workers)) -eq "$w" ] || continue
          PE=$scheme RESTORE= PINNED_ROOT=$PINNED_ROOT bash "$here/../../ruler/run.sh" "$root/ruler" || exit $?
        done
      ) &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    exit $status ;;
  *) echo "phase: questions, lr1e-3, descriptive, lr1e-3-descriptive, fox-gate, along or ruler, not '$phase'" >&2; exit 2 ;;
esac
# text and mqar rows, the default run's mix (conf/data/_loader.yaml; the preset alone trains on mqar rows only, where
# the corpus would not enter): README.md, "Setting"
common=(experiment=lost_in_the_middle data.recall_mix=0.25 "data.recall_curriculum=[[0,32,0.5],[200,64,0.5],[400,128,0.25]]"
        data.recall_loss=two_means "tags=${tags:-[lost_in_the_middle,v4]}")
RESTORE=${RESTORE-$here/runs}
# shellcheck disable=SC2086  # the schemes are words
corpus_sweeps "$root" "$seeds" $schemes
