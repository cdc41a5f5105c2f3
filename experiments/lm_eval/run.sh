#!/usr/bin/env bash
# The measured example of docs/evaluation.md ("Scoring a run with lm-evaluation-harness", issue 57): one trained
# run scored by lm-eval three ways on the same documents -- PELab's own lm-eval model (`--model pelab`), and the
# stock `hf` model on the run's `pelab-export` (GPT-NeoX where it maps, else remote code; REMOTE=1 forces remote
# code) -- with the per-document log-likelihoods compared. The task is local (no download): the first DOCS
# documents of the run's own test split (default 8), as JSON lines, rolling log-likelihood.
#   bash experiments/lm_eval/run.sh <run folder> <out folder>     (needs `pip install -e ".[lmeval,hf]"`)
set -eu
run=$1; out=$2
py=${PY:-python}
mkdir -p "$out/tasks"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$py" - "$run" "$out" "${DOCS:-8}" <<'PY'
import json, sys
from pathlib import Path

from pelab.data.sources import build_corpus
from pelab.data.disk import resolve_cache_root
from pelab.training.checkpoints import load_run_checkpoint
from pelab.runs.folder import resolve_ckpt_path

run, out, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
cfg = load_run_checkpoint(resolve_ckpt_path(str(run), Path.cwd()), key="checkpoint")["hyper_parameters"]["cfg"]
docs = []
for text in build_corpus(cfg["data"], str(resolve_cache_root())).documents("test"):
    docs.append(text)
    if len(docs) == n:
        break
(out / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
(out / "tasks" / "pelab_test.yaml").write_text(
    "task: pelab_test\ndataset_path: json\n"
    f"dataset_kwargs:\n  data_files:\n    test: {(out / 'test.jsonl').resolve()}\n"
    'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
    "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
print(f"task pelab_test: {len(docs)} test documents, {sum(len(t.encode()) for t in docs)} bytes")
PY
t0=$SECONDS
pelab-export "$run" "$out/hf" ${REMOTE:+--remote-code} --no-wandb
echo "export: $((SECONDS - t0)) s"
common=(--device cpu --tasks pelab_test --include_path "$out/tasks" --log_samples)
t0=$SECONDS
HF_DATASETS_OFFLINE=1 "$py" -m pelab.lm_eval run --model pelab --model_args "checkpoint=$run" "${common[@]}" \
  --output_path "$out/lm_eval_pelab" > "$out/lm_eval_pelab.log" 2>&1
echo "lm-eval --model pelab: $((SECONDS - t0)) s"
t0=$SECONDS
HF_DATASETS_OFFLINE=1 "$py" -m pelab.lm_eval run --model hf --model_args "pretrained=$out/hf,trust_remote_code=True" \
  "${common[@]}" --output_path "$out/lm_eval_hf" > "$out/lm_eval_hf.log" 2>&1
echo "lm-eval --model hf: $((SECONDS - t0)) s"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
def samples(name):
    (path,) = (out / name).rglob("samples_pelab_test_*.jsonl")
    return [float(json.loads(line)["resps"][0][0]) for line in path.read_text().splitlines()]
def results(name):
    (path,) = (out / name).rglob("results_*.json")
    return json.loads(path.read_text())["results"]["pelab_test"]
a, b = samples("lm_eval_pelab"), samples("lm_eval_hf")
rel = max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True))
arch = json.loads((out / "hf" / "pelab_export.json").read_text())["architecture"]
for name in ("lm_eval_pelab", "lm_eval_hf"):
    r = results(name)
    print(f"{name}: word_perplexity {r['word_perplexity,none']:.4f}, bits_per_byte {r['bits_per_byte,none']:.5f}")
print(f"export {arch}: {len(a)} documents, largest relative log-likelihood difference {rel:.2e}")
PY
