#!/usr/bin/env bash
# The GPU check of issue 18, one H200, no network, < 8 min (a global budget cuts the later sections short):
#
#   bash experiments/benchmarks/gpu_check.sh [OUT_DIR]            # default: $OUT, else results/gpu_check
#   bash experiments/benchmarks/gpu_check.sh --cpu-smoke [OUT_DIR] # every piece at tiny sizes on CPU
#
# Writes OUT_DIR/gpu_check.json (and each section's own JSON / log) and prints a digest:
#   attention    per score-bias scheme: the bias form, FlexAttention vs reference_attention (fp64) max error
#                in fp32 and bf16 (+ learned-bias gradients), fwd+bwd ms of flex vs the SDPA path
#   steps        training step per scheme (model=small, B=16, T=1024, bf16 autocast, fused AdamW): ms, x nope,
#                the attention path recorded (alibi and t5_bias also with model.attn_backend=flex)
#   train        python train.py pe=alibi trainer=gpu model=small ... (~2 min): summary.json (attention paths)
#   throughput   throughput.py: Lightning / plain loop per scheme (and MFU)
#   mfu          model=base, nope and alibi: MFU eager and compiled vs 989e12 and a bf16 matmul measured there
#   eval_memory  eval_memory.py: 32k-token evaluation forward, peak CUDA memory per scheme
#   probe_speed  probe_speed.py: probe samples/s (small, 4096 tokens, mqar)
#
# Needs hydra-core, omegaconf (+ antlr4-python3-runtime) and, for the W&B part of train.py, wandb: if they are
# not importable, wheels in $PELAB_WHEELS (default experiments/benchmarks/wheels) are installed with
# pip --no-index --no-deps --target into OUT_DIR/pydeps (see experiments/benchmarks/README.md, "GPU check").
set -u
cd "$(dirname "$0")/../.."
SMOKE=0
if [ "${1:-}" = "--cpu-smoke" ]; then SMOKE=1; shift; fi
OUT_DIR=${1:-${OUT:-experiments/benchmarks/results/gpu_check}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
BUDGET=${PELAB_GPU_CHECK_BUDGET:-450}  # seconds for all sections; each also has its own limit
START=$(date +%s)
: > "$OUT_DIR/failures.txt"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export PELAB_CACHE_DIR=${PELAB_CACHE_DIR:-$OUT_DIR/cache}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$OUT_DIR/inductor_cache}  # private: no stale kernels

# -- dependencies the GPU machine lacks: from carried wheels, no network ---------------------------------------
WHEELS=${PELAB_WHEELS:-experiments/benchmarks/wheels}
if ! python -c "import hydra, omegaconf" 2>/dev/null || ! python -c "import wandb" 2>/dev/null; then
  if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    python -m pip install --quiet --no-index --no-deps --target "$OUT_DIR/pydeps" "$WHEELS"/*.whl \
      > "$OUT_DIR/pip.log" 2>&1 || echo "pip install from $WHEELS failed: see $OUT_DIR/pip.log"
    export PYTHONPATH="$OUT_DIR/pydeps:${PYTHONPATH:-}"
  fi
fi
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
if ! python -c "import hydra, omegaconf"; then
  echo "hydra-core / omegaconf not importable and no usable wheels in $WHEELS: see experiments/benchmarks/README.md"
  exit 2
fi
LOGGER=csv
if python -c "import wandb" 2>/dev/null; then LOGGER=wandb; export WANDB_MODE=offline WANDB_SILENT=true; fi

# -- one section: its own time limit, cut to what is left of the budget; a failure is recorded, the rest runs ---
section() {  # section NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt 15 ]; then echo "== $name: skipped (budget spent)"; echo "$name:skipped" >> "$OUT_DIR/failures.txt"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s, $(( $(date +%s) - START )) s elapsed)"
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT_DIR/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT_DIR/$name.log"
  [ "$rc" -ne 0 ] && echo "$name:rc=$rc" >> "$OUT_DIR/failures.txt"
  echo "== $name: rc=$rc, $(( $(date +%s) - t0 )) s"
}

PY="python experiments/benchmarks/gpu_check.py"
if [ "$SMOKE" = 1 ]; then
  section attention 300 $PY attention --cpu-smoke --json "$OUT_DIR/attention.json"
  section steps 200 $PY steps --cpu-smoke --json "$OUT_DIR/steps.json"
  section train 300 bash -c "t0=\$(date +%s); python train.py pe=alibi model=micro tokenizer=byte trainer=cpu \
    data.seq_len=64 data.batch_size=4 data.recall_mix=0 data.val_windows=8 trainer.max_steps=6 \
    trainer.val_check_interval=6 eval.lengths=[1,2] eval.tokens=256 probes.samples=2 probes.lengths=[1] \
    logger=$LOGGER callbacks.progress_bar=false paths.output_dir=$OUT_DIR/train; rc=\$?; \
    echo \$((\$(date +%s) - t0)) > $OUT_DIR/train_seconds.txt; exit \$rc"
  section throughput 300 python experiments/benchmarks/throughput.py --pe nope alibi kerple --d 32 --layers 2 \
    --heads 2 --seq 32 --batch 2 --vocab 64 --steps 2 --warmup 1 --threads 1 --peak-n 256 --peak-repeats 2 \
    --json "$OUT_DIR/throughput.json"
  section mfu 200 $PY mfu --cpu-smoke --no-compile --json "$OUT_DIR/mfu.json"
  section eval_memory 200 python experiments/benchmarks/eval_memory.py --in-process --pe nope alibi fire \
    --lengths 256 --d 32 --layers 1 --heads 2 --vocab 64 --train-len 64 --threads 1 --json "$OUT_DIR/eval_memory.json"
  section probe_speed 200 python experiments/benchmarks/probe_speed.py --model micro --length 128 --kinds mqar \
    --samples 2 --threads 1 --json "$OUT_DIR/probe_speed.json"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT_DIR/gpu.txt"
  section attention 100 $PY attention --json "$OUT_DIR/attention.json"
  section steps 90 $PY steps --json "$OUT_DIR/steps.json"
  # the issue's end-to-end run (1 min 48 s there, cache build included): trains, evaluates to 16x, probes, W&B offline
  section train 170 bash -c "t0=\$(date +%s); python train.py pe=alibi trainer=gpu model=small data.seq_len=512 \
    data.batch_size=32 trainer.max_steps=400 logger=$LOGGER callbacks.progress_bar=false \
    paths.output_dir=$OUT_DIR/train; rc=\$?; echo \$((\$(date +%s) - t0)) > $OUT_DIR/train_seconds.txt; exit \$rc"
  section throughput 100 python experiments/benchmarks/throughput.py --device cuda --dtype bf16 --d 384 \
    --layers 6 --heads 6 --seq 1024 --batch 16 --vocab 32768 --steps 15 --warmup 3 --peak-flops 989e12 \
    --pe nope sinusoidal learned t5_bias rope xpos alibi kerple sandwich fire cope --json "$OUT_DIR/throughput.json"
  section mfu 120 $PY mfu --json "$OUT_DIR/mfu.json"
  section eval_memory 60 python experiments/benchmarks/eval_memory.py --device cuda --dtype bf16 --in-process \
    --pe nope sinusoidal learned t5_bias rope xpos alibi kerple sandwich fire cope --lengths 32768 --d 384 \
    --layers 6 --heads 6 --vocab 4096 --train-len 1024 --json "$OUT_DIR/eval_memory.json"
  section probe_speed 60 python experiments/benchmarks/probe_speed.py --model small --length 4096 --kinds mqar \
    --device cuda --dtype bf16 --batch-size 256 --batch-tokens 1048576 --samples 40 --json "$OUT_DIR/probe_speed.json"
fi
$PY collect "$OUT_DIR" | tee "$OUT_DIR/digest.txt"
echo "gpu_check: $(( $(date +%s) - START )) s in all; $OUT_DIR/gpu_check.json"
