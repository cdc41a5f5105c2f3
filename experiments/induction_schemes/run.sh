#!/usr/bin/env bash
# The induction-heads table's CPU runs (README.md, issue 52): Mamba's Table 11 task and recipe (experiment=induction_heads,
# 25,000 steps), the schemes of the declared questions (ALiBi, NoPE; RoPE's row is issue 51's).
#   pilot   the learning-rate pilot: RoPE, ALiBi, NoPE at 2e-4 and 1e-3, seed 0, 10,000 steps, no final evaluation,
#           into <root>/pilot; then  python experiments/induction_schemes/choose_lr.py <root>/pilot --json <root>/lr.json
#   seeds   ALiBi and NoPE at seeds 0-4 at their chosen rate (<root>/lr.json), into <root>/sweep: per seed, ALiBi then
#           NoPE, so that after k seeds both rows have k
#   scalings issue 51's RoPE checkpoints (RUNS51, default its study's sweep; seeds 1-4: seed 0's was lost) evaluated
#           with PI / NTK / YaRN at factor F in FACTORS (default 4 8 16 32 64), each at its length F x 2^8 (2^10-2^14),
#           into <root>/scalings/rope-s<s>-x<F>
# From a clean git worktree of the commit pinned at the first launch (<root>/COMMIT; ../pinned.sh), WORKERS (default 2)
# workers at one thread each under nice 10, sharing the folder (a job held by one worker is left to it). Relaunch the
# same command to go on: finished jobs are skipped, an interrupted one resumes from its last checkpoint.
#   setsid nohup bash experiments/induction_schemes/run.sh pilot [root] > /dev/null 2>&1 &   (root: /work/studies/induction_schemes)
#   python -m pelab.report collect <root>/sweep experiments/induction_schemes/runs
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../pinned.sh"
phase=${1:?"pilot, seeds or scalings"}
root=${2:-/work/studies/induction_schemes}
commit=$(pinned_commit "$root")
name='name=${pe.name}-induction-L${data.seq_len}-lr${optim.lr}-s${seed}'
echo "$(date -u +%FT%TZ) launch $phase: commit $commit, ${WORKERS:-2} worker(s)" >> "$root/launches.log"
worker() {  # <n>
  case $phase in
    pilot)
      pinned_train "$commit" -m experiment=induction_heads seed=0 pe=rope,alibi,nope optim.lr=2e-4,1e-3 \
        trainer.max_steps=10000 evaluate_after_fit=false "tags=[induction_schemes,lr_pilot]" "$name" \
        hydra.sweep.dir="$root/pilot" ;;
    seeds)
      [ -s "$root/lr.json" ] || { echo "no $root/lr.json: run the pilot and choose_lr.py first"; return 2; }
      for s in ${SEEDS:-0 1 2 3 4}; do
        for pe in alibi nope; do
          lr=$("$VENV_PY" -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]['lr'])" "$root/lr.json" "$pe")
          pinned_train "$commit" -m experiment=induction_heads seed="$s" pe="$pe" optim.lr="$lr" \
            "tags=[induction_schemes]" "$name" hydra.sweep.dir="$root/sweep"
        done
      done ;;
    scalings)
      i=0  # the (seed, factor) jobs dealt round-robin to the workers
      for s in ${SEEDS:-1 2 3 4}; do
        for f in ${FACTORS:-4 8 16 32 64}; do
          i=$((i + 1))
          [ $(((i - 1) % ${WORKERS:-2} + 1)) = "$1" ] || continue
          out="$root/scalings/rope-s$s-x$f"
          finished "$out" && continue
          pinned_eval "$commit" ckpt_path="${RUNS51:-/work/studies/induction_heads/study/sweep}/0_rope-induction-L256-s$s/checkpoints/last.ckpt" \
            pe.scaling.factor="$f" "scaling_sweep=[linear,ntk,yarn]" "probes.lengths=[$f]" "eval.lengths=[1]" \
            hydra.run.dir="$out"
        done
      done ;;
    *) echo "phase: pilot, seeds or scalings, not '$phase'"; return 2 ;;
  esac >> "$root/worker$1.log" 2>&1
}
for w in $(seq 1 "${WORKERS:-2}"); do
  worker "$w" &
  sleep 30  # the next worker starts on the next job
done
wait
echo "$(date -u +%FT%TZ) $phase: worker(s) done" >> "$root/launches.log"
