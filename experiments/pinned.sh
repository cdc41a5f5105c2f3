# Sourced by the studies' run scripts (induction_heads, corpora): run train.py from a clean git worktree of one
# commit, so that a study launched while the main checkout has uncommitted changes (other work in progress) records
# clean provenance, and a relaunch runs the same code as the first launch. As experiments/provenance/verify.py: `python -S` (no editable-install
# finder, which would map pelab.conf to the main checkout) with the worktree's src first, then the venv's packages.
#   pinned_train <commit> <train.py arguments ...>     (one thread, nice 10)
#   pinned_eval <commit> <eval.py arguments ...>       (the same for an evaluation of a checkpoint)
#   pinned_sweeps <root> <commit> <arm ...>            (the arms' sweeps, WORKERS workers each: layouts, lr_grid, ...;
#                                                       RESTORE: the collected runs put back first)
#   finished <run folder>                              (its summary.json says status ok)
#   scheme_args <scheme>                               (a scheme's train.py arguments: pe=..., or a layout preset's)
#   chosen_lr <scheme> <corpus>                        (its rate from the learning-rate grid's choice.json)
#   corpus_sweeps <root> <seeds> <scheme ...>          (each scheme on each corpus at its chosen rate: the v4 studies)
# DRY_RUN=1: print each command (train.py / eval.py and its arguments, one line) instead of running it, so that a
# study's launches can be checked (composed, validated) without training: tests/test_v4_studies.py.
REPO=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
VENV_PY=${VENV_PY:-$REPO/.venv/bin/python}
PINNED_ROOT=${PINNED_ROOT:-/work/studies/code}  # one worktree per pinned commit, shared by the studies

# nice 10 alone does not hold here: with the kernel's autogroups (/proc/sys/kernel/sched_autogroup_enabled) each
# session competes as one group whatever its processes' nice, and a study launched with setsid took as much CPU as a
# test suite run from another session (2026-12-06: 64 % per worker against the suite's 22 and 14). A study in a
# session of its own (setsid, as every README launches it) therefore nices that session's group too.
if [ -z "${DRY_RUN:-}" ] && [ "$(ps -o sid= -p $$ | tr -d ' ')" = "$$" ] && [ -w /proc/$$/autogroup ]; then
  echo 10 > /proc/$$/autogroup 2>/dev/null || true
fi

pinned_commit() {  # <study root>: the commit pinned at the study's first launch (<root>/COMMIT, written then). On a
  # new machine (no <root>/COMMIT) with runs collected from the root (RESTORE), the commit they ran: the study goes on
  # with the code it started with, not HEAD.
  if [ -n "${DRY_RUN:-}" ]; then  # a dry run pins nothing
    [ -s "$1/COMMIT" ] && cat "$1/COMMIT" || git -C "$REPO" rev-parse HEAD
    return 0
  fi
  mkdir -p "$1"
  [ -s "$1/COMMIT" ] || collected_commit "$1" > "$1/COMMIT" || return 1
  [ -s "$1/COMMIT" ] || git -C "$REPO" rev-parse HEAD > "$1/COMMIT"
  cat "$1/COMMIT"
}

collected_commit() {  # <study root>: the commit of the runs under RESTORE that ran under that root (nothing if none;
  # two commits: one line and status 1, for a relaunch cannot go on with both)
  [ -d "${RESTORE:-}" ] || return 0
  "$VENV_PY" - "$RESTORE" "$1" <<'PY'
import pathlib, sys
from pelab.report.generated import runs_of
collected, root = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).resolve()
commits = {((r.get("provenance") or {}).get("code") or {}).get("git") for _, r in runs_of(collected, root)}
commits.discard(None)  # a run without provenance names none
if len(commits) > 1:
    sys.exit(f"{collected}: runs of {root} from more than one commit ({sorted(map(str, commits))}): write the one to go on with into {root}/COMMIT")
if commits:
    print(*commits)
PY
}

pinned_tree() {  # <commit>: the worktree's path (created once, kept)
  local tree="$PINNED_ROOT/$1"
  if [ ! -d "$tree" ]; then
    mkdir -p "$PINNED_ROOT"
    git -C "$REPO" worktree add --detach "$tree" "$1" >/dev/null 2>&1 || { echo "git worktree add $tree $1 failed" >&2; return 1; }
  fi
  echo "$tree"
}

pinned_script() {  # <commit> <train.py | eval.py> <its arguments ...>
  local commit=$1 script=$2; shift 2
  local tree purelib
  if [ -n "${DRY_RUN:-}" ]; then echo "$script $*"; return 0; fi
  tree=$(pinned_tree "$commit") || return 1
  purelib=$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  (cd "$tree" && env -u PYTHONPATH PYTHONPATH="$tree/src:$purelib" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
     PYTHONUNBUFFERED=1 nice -n 10 "$VENV_PY" -S "$script" "$@")
}

pinned_train() { local commit=$1; shift; pinned_script "$commit" train.py "$@"; }  # <commit> <train.py arguments>
pinned_eval() { local commit=$1; shift; pinned_script "$commit" eval.py "$@"; }  # <commit> <eval.py arguments>

pinned_sweeps() {  # <root> <commit> <arm ...>: the arms one after another, each a Hydra sweep in <root>/sweep-<arm>
  # shared by WORKERS (default 2) workers: train.py -m "${common[@]}" $(arm_args <arm>), the caller's array and
  # function; a job held by one worker (its folder's lock) is left to it. Each worker goes through the arms on its
  # own, so one that finds nothing left in an arm starts on the next while the others finish theirs (an arm of three
  # seeds on two workers no longer leaves a core idle for its last job). Launches and ends in <root>/launches.log.
  # RESTORE (a folder the study's runs were collected into) first puts its finished runs back under <root>
  # (python -m pelab.report restore), so that a relaunch on a new machine skips them.
  local root=$1 commit=$2 arm w
  shift 2
  restore_runs "$root" || return 1  # the runs collected on an earlier machine are not retrained
  if [ -n "${DRY_RUN:-}" ]; then  # one line per arm, not per worker, and no log
    for arm in "$@"; do
      # shellcheck disable=SC2046
      pinned_train "$commit" -m "${common[@]}" $(arm_args "$arm") hydra.sweep.dir="$root/sweep-$arm"
    done
    return 0
  fi
  echo "$(date -u +%FT%TZ) launch $*: commit $commit, ${WORKERS:-2} worker(s)" >> "$root/launches.log"
  for w in $(seq 1 "${WORKERS:-2}"); do
    (
      for arm in "$@"; do
        echo "$(date -u +%FT%TZ) worker $w: $arm" >> "$root/launches.log"
        # shellcheck disable=SC2046  # the arm's arguments are words
        pinned_train "$commit" -m "${common[@]}" $(arm_args "$arm") hydra.sweep.dir="$root/sweep-$arm" \
          >> "$root/worker$w.log" 2>&1
      done
      echo "$(date -u +%FT%TZ) worker $w: every arm done" >> "$root/launches.log"
    ) &
    sleep 30  # the next worker starts on the next job
  done
  wait
}

restore_runs() {  # <root>: RESTORE (a folder this root's runs were collected into) puts its finished runs back
  # under <root> (python -m pelab.report restore; its lines into <root>/launches.log), so that a relaunch on a new
  # machine skips them. Nothing without RESTORE or in a dry run.
  [ -z "${DRY_RUN:-}" ] && [ -d "${RESTORE:-}" ] || return 0
  "$VENV_PY" -m pelab.report restore "$RESTORE" "$1" >> "$1/launches.log" 2>&1
}

finished() {  # <run folder>: its summary.json says status ok (a relaunch skips it)
  [ -f "$1/summary.json" ] &&
    python3 -c "import json, sys; sys.exit(json.load(open(sys.argv[1]))['status'] != 'ok')" "$1/summary.json" 2>/dev/null
}

scheme_args() {  # <scheme>: its train.py arguments. A layout preset (irope, rnope_swa) is RoPE with that layout, its model
  # named tiny-<preset> (experiments/layouts' row labels); any other scheme is a pe= choice.
  case $1 in
    irope|rnope_swa) echo "pe=rope layout=$1 model.name=tiny-$1" ;;
    *) echo "pe=$1" ;;
  esac
}

CHOICE=${CHOICE:-$REPO/experiments/lr_grid/choice.json}  # the learning-rate grid's choice, {scheme: {corpus: lr}}

chosen_lr() {  # <scheme> <corpus>: the grid's rate for them; if none, one line naming what is missing and status 1
  "$VENV_PY" - "$CHOICE" "$1" "$2" <<'PY'
import json, pathlib, sys
path, scheme, corpus = sys.argv[1:]
if not pathlib.Path(path).is_file():
    sys.exit(f"no {path}: run the learning-rate grid and its choose.py first (experiments/lr_grid/README.md)")
lr = json.loads(pathlib.Path(path).read_text()).get(scheme, {}).get(corpus)
if lr is None:
    sys.exit(f"{path} has no rate for scheme {scheme} on corpus {corpus}: run that cell of the grid and choose.py")
print(lr)
PY
}

corpus_sweeps() {  # <root> <seeds, e.g. "0 1 2"> <scheme ...>: each scheme on each corpus (data=stdlib, data=django_docs;
  # CORPORA="django_docs": one of them, for a top-up the re-estimated plan asks of one corpus) at its chosen rate, one
  # multirun over the seeds each (pinned_sweeps: <root>/sweep-<scheme>.<corpus>), with the caller's `common` arguments
  # and EXTRA's words. Every rate is looked up first: a missing one returns 2 (after its one line) before any run.
  local root=$1 seeds=$2 corpus scheme extra arms=()
  shift 2
  declare -gA CHOSEN=()
  for corpus in ${CORPORA:-stdlib django_docs}; do
    case $corpus in stdlib|django_docs) ;; *) echo "CORPORA: stdlib and/or django_docs, not '$corpus'" >&2; return 2 ;; esac
    for scheme in "$@"; do
      CHOSEN[$scheme.$corpus]=$(chosen_lr "$scheme" "$corpus") || return 2
      arms+=("$scheme.$corpus")
    done
  done
  read -r -a extra <<< "${EXTRA:-}"
  # shellcheck disable=SC2086  # the seeds are words
  common+=(seed="$(echo $seeds | tr ' ' ,)" "${extra[@]}")
  arm_args() { echo "$(scheme_args "${1%.*}") data=${1#*.} optim.lr=${CHOSEN[$1]}"; }  # <scheme>.<corpus>
  local commit
  commit=$(pinned_commit "$root") || return 2
  pinned_sweeps "$root" "$commit" "${arms[@]}"
}
