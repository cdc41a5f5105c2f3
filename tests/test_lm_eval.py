"""pelab.lm_eval: a PELab checkpoint scored by EleutherAI's lm-evaluation-harness gives PELab's own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="the lmeval extra (lm-eval) is not installed")

import torch
from lm_eval.api.instance import Instance

from pelab.evaluation.extrapolation import Window, score_windows, window_plan
from pelab.lm_eval import PELabLM, main

# Python source, as the reference run was trained on: 3 windows of 32 tokens and a part (lm-eval's last window)
TEXTS = [("def add(a, b):\n    return a + b\n\n\nclass Box:\n    def __init__(self, x):\n        self.x = x\n"
          "        self.y = None\n"),
         "import os\nprint(os.path.join('a', 'b'))\n"]


@pytest.fixture(scope="module")
def lm(reference) -> PELabLM:
    """The reference run (micro model, byte tokenizer, L = 32) through lm-eval's interface, from its run folder."""
    return PELabLM(checkpoint=str(reference), device="cpu")


def pelabs_own_nll(lm: PELabLM, text: str) -> float:
    """Summed NLL of `text` by PELab's evaluation (`score_windows`) over [EOT] + its tokens, in lm-eval's rolling
    windows: non-overlapping windows of L (`window_plan`), the last one ending at the text's end with L inputs."""
    tokens = [lm.eot_token_id, *lm.tok_encode(text)]
    n, L = len(tokens) - 1, lm.max_length
    plan = window_plan(n, L)
    if n > L and plan[-1].length < L:  # lm-eval gives the last window a full L of inputs (its context_len=1)
        plan[-1] = Window(n - L, n, plan[-1].score_from)
    with torch.no_grad():
        sums, scored = score_windows(lm.model, torch.tensor(tokens)[None], plan, per_batch=4)
    assert scored == n
    return sums[0]


def test_rolling_loglikelihood_is_pelabs_own_evaluation(lm):
    """loglikelihood_rolling (lm-eval's windowing, this model's scoring) = minus PELab's summed NLL, 1e-5 relative,
    over a text longer than three windows and one shorter than one."""
    assert lm.max_length == 32 and len(lm.tok_encode(TEXTS[0])) > 3 * 32
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(TEXTS)])
    for text, ll in zip(TEXTS, got, strict=True):
        assert ll == pytest.approx(-pelabs_own_nll(lm, text), rel=1e-5)


def test_loglikelihood_and_greedy_generation_agree(lm):
    """An empty context scores from the EOT prefix, as the rolling window does; the model's own greedy continuation
    is `is_greedy` and is what generate_until returns (stopped at its stop sequence)."""
    text = TEXTS[1][:30]
    (ll, _), = lm.loglikelihood([Instance("loglikelihood", {}, ("", text), 0)])
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert ll == pytest.approx(rolling, rel=1e-6)
    context = "import os"  # no trailing whitespace: lm-eval moves it into the continuation
    (generated,) = lm.generate_until([Instance("generate_until", {}, (context, {"max_gen_toks": 6, "until": []}), 0)])
    assert generated and len(lm.tok_encode(generated)) <= 6
    (ll_gen, greedy), = lm.loglikelihood([Instance("loglikelihood", {}, (context, generated), 0)])
    assert greedy and ll_gen < 0
    (_, not_greedy), = lm.loglikelihood([Instance("loglikelihood", {}, (context, generated[::-1] + "#"), 0)])
    assert not not_greedy
    stop = generated[2:4]
    (cut,) = lm.generate_until([Instance("generate_until", {}, (context, {"max_gen_toks": 6, "until": [stop]}), 0)])
    assert cut == generated.split(stop)[0]


@pytest.fixture
def local_task(tmp_path, monkeypatch) -> Path:
    """A folder with the task `pelab_text`: rolling log-likelihood of TEXTS, read from a local JSON file."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "pelab_text.yaml").write_text(
        "task: pelab_text\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {docs}\n"
        'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: bits_per_byte\n")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    return tmp_path / "tasks"


def assert_pelabs_numbers(lm: PELabLM, out: Path) -> None:
    """Each document's log-likelihood that lm-eval logged under `out` is minus PELab's summed NLL."""
    (samples,) = out.rglob("samples_pelab_text_*.jsonl")
    logged = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(logged) == len(TEXTS)
    for row in logged:
        assert float(row["resps"][0][0]) == pytest.approx(-pelabs_own_nll(lm, row["doc"]["text"]), rel=1e-5)
    (results,) = out.rglob("results_*.json")
    assert "bits_per_byte,none" in json.loads(results.read_text())["results"]["pelab_text"]


@pytest.mark.slow
def test_the_cli_scores_a_local_task_with_pelabs_numbers(lm, reference, local_task, tmp_path):
    """`python -m pelab.lm_eval run --model pelab ...` (lm-eval's own CLI, the model registered by the import) on a
    task YAML reading local documents (no download): each document's logged log-likelihood is PELab's."""
    main(["run", "--model", "pelab", "--model_args", f"checkpoint={reference}", "--device", "cpu",
          "--tasks", "pelab_text", "--include_path", str(local_task), "--output_path", str(tmp_path / "out"),
          "--log_samples"])
    assert_pelabs_numbers(lm, tmp_path / "out")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["gpt_neox", "remote_code"])
def test_the_exported_run_scores_the_same_through_lm_evals_hf_model(how, lm, reference, local_task, tmp_path):
    """pelab-export (GPT-NeoX, or PELab's remote code), then lm-eval's stock `hf` model (transformers'
    AutoModelForCausalLM and AutoTokenizer of the export) through `simple_evaluate`, the Python route (a task
    manager of the local task alone: lm-eval's CLI indexes its thousands of tasks first, seconds the CLI test above
    already spends): the same log-likelihoods as PELab's own evaluation."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    from pelab.export import main as export

    folder = tmp_path / f"hf_{how}"  # transformers names a remote module by its folder: one per export
    assert export([str(reference), str(folder), *(["--remote-code"] if how == "remote_code" else [])]) == 0
    model_args = f"pretrained={folder}" + (",trust_remote_code=True" if how == "remote_code" else "")
    results = lm_eval.simple_evaluate(model="hf", model_args=model_args, device="cpu",
                                      tasks=["pelab_text"], log_samples=True,
                                      task_manager=TaskManager(include_path=str(local_task), include_defaults=False))
    logged = results["samples"]["pelab_text"]
    assert len(logged) == len(TEXTS)
    for row in logged:
        assert float(row["resps"][0][0]) == pytest.approx(-pelabs_own_nll(lm, row["doc"]["text"]), rel=1e-5)


def test_a_bad_model_arg_is_one_line_naming_it(reference):
    from pelab.errors import ConfigError

    with pytest.raises(ConfigError, match="--model_args temperature"):
        PELabLM(checkpoint=str(reference), temperature=2)


def test_a_checkpoint_with_a_datamodule_group_loads(reference, tmp_path):
    """A checkpoint recorded before the data group named its DataModule (a `datamodule` group with
    `datamodule.source`, no data._target_) scores as it did."""
    from helpers.runs import load_checkpoint
    from pelab.lm_eval import load_scoring_model
    from test_checkpoints import old_datamodule_group

    ckpt = load_checkpoint(reference / "checkpoints" / "last.ckpt")
    ckpt["hyper_parameters"]["cfg"] = old_datamodule_group(ckpt["hyper_parameters"]["cfg"])
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    _, tok, cfg = load_scoring_model(old)
    assert "datamodule" not in cfg and cfg.data._target_ == "pelab.data.datamodule.LMDataModule"
    assert tok.encode("ab") == PELabLM(checkpoint=str(reference), device="cpu").tokenizer.encode("ab")
