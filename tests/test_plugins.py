"""A probe kind and an evaluation defined outside the package: one module written to tmp_path (on sys.path), named
by `+probes.plugins=[...]` and chosen by `probes.kinds=[...]`, zero files of src/ or conf/ touched. A real
`train()` (Lightning, the real suite) probes the kind and runs the evaluation; the evaluation scores the kind's
samples with the model's plain forward, so the suite's probe accuracy must equal it. (Its metric is in the probe
family: pelab.metric_keys knows the families extrap, probe and attn only.)"""

from __future__ import annotations

import sys
import textwrap

import pytest

from helpers.plugins import TOY_KIND
from helpers.runs import FAST, compose
from pelab.data.recall import PROBE_KINDS
from pelab.evaluation.registry import EVALUATIONS
from pelab.tasks.train import train

# The toy probe kind (tests/helpers/plugins.py) and, in the same module, an evaluation that scores its samples.
PLUGIN = TOY_KIND + '''
import matplotlib.pyplot as plt
import torch

from pelab.data.recall import make_probe_samples
from pelab.evaluation.common import evaluating
from pelab.evaluation.registry import EvalResult, Evaluation, ReportSection, register_evaluation
from pelab.metric_keys import metric_key


def run(model, datamodule, s):
    """The kind's accuracy at the training length, from the model's whole forward (not the probe scorer)."""
    p = s.cfg.probes
    samples = make_probe_samples("repeat_letter", datamodule.tokenizer, s.train_length, 0.0, int(p.samples), int(p.seed))
    x = torch.tensor([q.input_ids + q.answer_ids for q in samples], device=s.device)
    with evaluating(model), torch.no_grad():
        pred = model(x)[:, -2].argmax(-1).cpu()
    acc = (pred == torch.tensor([q.answer_ids[0] for q in samples])).float().mean().item()
    fig = plt.figure()
    plt.bar(["acc"], [acc])
    return EvalResult({metric_key("probe/repeat_letter/forward_acc", s.train_length): acc}, {"acc": acc, "n": len(samples)},
                      {"check_acc": fig})


register_evaluation(Evaluation("check", run, sections=(ReportSection("Check", (("probe/repeat_letter/forward_acc", "Accuracy from a plain forward"),)),)))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "toy_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "toy_plugin"
    PROBE_KINDS.pop("repeat_letter", None)
    EVALUATIONS.pop("check", None)
    sys.modules.pop("toy_plugin", None)


@pytest.mark.slow
def test_a_probe_kind_and_an_evaluation_from_outside_run_end_to_end(plugin, tmp_path):
    out = tmp_path / "run"
    cfg = compose([*FAST, "logger=csv", "trainer.max_steps=6", "eval.lengths=[1]", f"+probes.plugins=[{plugin}]",
                   "probes.kinds=[repeat_letter,passkey]", "probes.samples=16", "probes.depths=[0.0,1.0]"], out)
    summary = train(cfg)
    assert summary["status"] == "ok"
    m, ev = summary["metrics"], summary["evaluation"]
    assert m["probe/repeat_letter/acc@32"] == pytest.approx(m["probe/repeat_letter/forward_acc@32"])  # the suite's probe = a plain forward
    assert ev["check"] == {"acc": pytest.approx(m["probe/repeat_letter/forward_acc@32"]), "n": 16}
    assert ev["probes"]["chance"]["repeat_letter"] == pytest.approx(0.25)  # its own four letters
    assert "probe/passkey/acc@32" in m and "extrap/ppl@32" in m  # the built-in ones still run beside them
    assert (out / "plots" / "check_acc.png").stat().st_size > 1000
    assert (out / "plots" / "probe_repeat_letter_heatmap.png").exists()
    from pelab.report import build_report

    md = build_report([out], tmp_path / "report").markdown
    assert "## Check" in md and "## Probe: repeat_letter" in md
