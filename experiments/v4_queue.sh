#!/usr/bin/env bash
# What is left of the v4 studies on the CPU (issue 59), one phase after another, in the order of each study's Status:
# the context extension's twenty seeds (declared questions first), then the retrieval study's along-training arm, its
# descriptive rows at 1e-3 and its RULER phase, then the length-extrapolation study's descriptive rows, then the
# context extension's along-training arm (declared after its read). Each phase is
# its study's own script at its default root (/work/studies/<study>_v4) and pinned commit; each puts the runs
# collected into the repository back first and skips what is finished, so relaunching this one command on a new
# machine goes on where the last one stopped (collect each phase's runs before a machine goes: the studies' READMEs).
# A phase that fails stops the queue, naming it. SKIP="along ruler" leaves phases out; DRY_RUN=1 prints the commands.
#   setsid nohup bash experiments/v4_queue.sh > /dev/null 2>&1 &     (its log: /work/studies/v4_queue.log)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# pinned.sh nices the scheduler group of the session its sourcer leads: the phases' scripts do not lead the queue's,
# so the queue sources it (before 2026-12-07 21:00 UTC its jobs ran at full weight beside anything else)
. "$here/pinned.sh"
log=${QUEUE_LOG:-/work/studies/v4_queue.log}
[ -z "${DRY_RUN:-}" ] || log=/dev/stderr
[ -n "${DRY_RUN:-}" ] || mkdir -p "$(dirname "$log")"
phase() {  # <name> <command ...>
  local name=$1; shift
  case " ${SKIP:-} " in *" $name "*) echo "$(date -u +%FT%TZ) queue: $name skipped (SKIP)" >> "$log"; return 0 ;; esac
  echo "$(date -u +%FT%TZ) queue: $name: $*" >> "$log"
  "$@" || { echo "$(date -u +%FT%TZ) queue: $name FAILED (exit $?): the queue stops" >> "$log"; exit 1; }
}
# the context extension's seeds as its re-estimate decided (its README, "Seeds": twenty), less those collected whole
# (the control arm is a stream's last job): a collected seed's fine-tuned arms would be launched again against a
# parent checkpoint that collect leaves behind
ce_runs=$here/context_extension/v4/runs
left=$(for s in $(seq 0 19); do [ -d "$ce_runs/control/s$s" ] || printf '%s ' "$s"; done)
if [ -n "$left" ]; then SEEDS="$left" phase context_extension bash "$here/context_extension/v4/run.sh"; fi
phase along bash "$here/lost_in_the_middle/v4/run.sh" along
phase lr1e-3-descriptive bash "$here/lost_in_the_middle/v4/run.sh" lr1e-3-descriptive
phase ruler bash "$here/lost_in_the_middle/v4/run.sh" ruler
phase le-descriptive bash "$here/length_extrapolation/v4/run.sh" descriptive
phase ce-along bash "$here/context_extension/v4/run.sh" along
echo "$(date -u +%FT%TZ) queue: every phase ended" >> "$log"
