#!/usr/bin/env bash
# The RULER-style kinds' committed runs (issue 56, docs/ruler.md): one run per kind at the minimum difficulty
# (data.recall_ruler's defaults), rope, seed 0, each family's preset (experiment=ruler_niah / ruler_vt / ruler_cwe) to
# its in-window criterion, then probed at 1-8 x L with the effective length. One run after another, one thread under
# nice 10, from a clean worktree of the commit pinned at the first launch (<root>/COMMIT; ../pinned.sh, its worktrees
# under <root>/code, not the studies' folder). KINDS narrows the list (KINDS="niah_multikey vt"); PE names another
# scheme (default rope; the lost-in-the-middle study v4 runs each of its schemes); a relaunch skips the runs that
# finished (summary.json status ok), and RESTORE puts collected runs back first (a relaunch on a new machine).
#   setsid nohup bash experiments/ruler/run.sh [root] > /dev/null 2>&1 &      (root: /tmp/pelab-ruler)
#   python -m pelab.report collect <root>/runs experiments/ruler/runs
#   python -m pelab.report experiments/ruler/runs --out experiments/ruler/report
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=${1:-/tmp/pelab-ruler}
export PINNED_ROOT=${PINNED_ROOT:-$root/code}
. "$here/../pinned.sh"
[ -n "${DRY_RUN:-}" ] || mkdir -p "$root/runs"
commit=$(pinned_commit "$root")
# RESTORE (a folder this root's runs were collected into, e.g. the retrieval study v4's ruler/runs): put them back
# first, so that a relaunch on a new machine skips them
restore_runs "$root" || exit 1
kind_args() {  # <kind>: its preset
  case $1 in
    niah_*) echo "experiment=ruler_niah callbacks.retrieval_criterion.kind=$1" ;;
    vt) echo "experiment=ruler_vt" ;;
    cwe) echo "experiment=ruler_cwe" ;;
  esac
}
for kind in ${KINDS:-niah_single niah_multikey niah_multivalue niah_multiquery vt cwe}; do
  run="$root/runs/${PE:-rope}-$kind-L128-s0"
  finished "$run" && continue
  log=$root/${PE:-rope}-$kind.log launches=$root/launches.log
  [ -z "${DRY_RUN:-}" ] || log=/dev/stdout launches=/dev/null  # a dry run prints the command, writes nothing
  echo "$(date -u +%FT%TZ) ${PE:-rope} $kind: commit $commit" >> "$launches"
  start=$(date +%s)
  # shellcheck disable=SC2046  # the preset's arguments are words
  pinned_train "$commit" $(kind_args "$kind") pe="${PE:-rope}" seed=0 hydra.run.dir="$run" >> "$log" 2>&1
  echo "$(date -u +%FT%TZ) ${PE:-rope} $kind: exit $?, $(( $(date +%s) - start )) s wall" >> "$launches"
done
