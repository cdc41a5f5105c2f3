"""experiments/lr_grid (issue 59): the rule that picks each scheme's learning rate from its grid (lowest final
in-window validation perplexity, flags at the grid's end and for an overlapping runner-up), and the grid's arms
compose and validate as run.sh launches them."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from helpers.runs import ROOT, compose
from pelab.tasks.config import validate

spec = importlib.util.spec_from_file_location("lr_choose", ROOT / "experiments/lr_grid/choose.py")
choose_mod = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = choose_mod  # its dataclass looks its module up
spec.loader.exec_module(choose_mod)
Cell = choose_mod.Cell


def test_the_lowest_validation_perplexity_wins_with_its_flags():
    cells = [Cell("rope", "stdlib", lr, ppl, ppl - 0.05, ppl + 0.05)
             for lr, ppl in [(1e-3, 3.40), (2e-3, 3.20), (4e-3, 3.22), (8e-3, 3.60)]]
    cells += [Cell("alibi", "stdlib", lr, ppl, ppl - 0.01, ppl + 0.01)
              for lr, ppl in [(1e-3, 3.10), (2e-3, 3.30), (4e-3, 3.50), (8e-3, 3.90)]]
    choice = choose_mod.choose(cells)
    assert choice[("rope", "stdlib")]["lr"] == 2e-3
    assert choice[("rope", "stdlib")]["overlaps_next"] and not choice[("rope", "stdlib")]["at_edge"]
    assert choice[("alibi", "stdlib")]["lr"] == 1e-3
    assert choice[("alibi", "stdlib")]["at_edge"] and not choice[("alibi", "stdlib")]["overlaps_next"]
    text = choose_mod.table(choice)
    assert re.search(r"\| alibi \| stdlib \| \*\*3\.100 \[3\.090, 3\.110\]\*\* \|.*\| 0\.001 \| at the grid's end \|", text)
    with pytest.raises(ValueError, match="two runs at one rate"):
        choose_mod.choose(cells + [cells[0]])


def test_a_scheme_not_yet_run_at_every_rate_of_the_grid_gets_no_rate():
    """A session ends mid-grid: the cells run so far are shown, marked incomplete, and left out of choice.json, so a
    study cannot start at a rate chosen from part of the grid."""
    cells = [Cell("alibi", "stdlib", lr, ppl, ppl - 0.01, ppl + 0.01) for lr, ppl in [(1e-3, 3.3), (2e-3, 3.1), (4e-3, 3.2)]]
    choice = choose_mod.choose(cells)
    assert choice[("alibi", "stdlib")]["lr"] is None and choice[("alibi", "stdlib")]["missing"] == [8e-3]
    assert re.search(r"\| alibi \| stdlib \| .* \| — \| incomplete: not run at 0\.008 \|", choose_mod.table(choice))


def summary(name="tiny", pe="rope", step=1500):
    return {"output_dir": "x", "global_step": step,
            "config": {"trainer": {"max_steps": 1500}, "model": {"name": name}, "pe": {"name": pe},
                       "data": {"source": "django_docs"}, "optim": {"lr": 4e-3}},
            "metrics": {"val/ppl": 3.0, "val/ppl_lo": 2.9, "val/ppl_hi": 3.1}}


def test_a_cell_names_a_layout_by_its_preset_and_refuses_an_incomplete_run():
    assert choose_mod.cell(summary()) == Cell("rope", "django_docs", 4e-3, 3.0, 2.9, 3.1)
    assert choose_mod.cell(summary(name="tiny-irope")).scheme == "irope"
    with pytest.raises(ValueError, match="step 700 of 1500: not complete"):
        choose_mod.cell(summary(step=700))


@pytest.mark.parametrize("arm", [["pe=fire"], ["pe=fox"], ["pe=rope", "layout=irope", "model.name=tiny-irope"],
                                 ["pe=rope", "layout=rnope_swa", "model.name=tiny-rnope_swa"]])
def test_the_grids_arms_compose_and_validate_on_both_corpora(arm):
    run_sh = (ROOT / "experiments/lr_grid/run.sh").read_text()
    for a in arm:  # the arm as run.sh launches it
        assert a.split("=")[1].split(",")[0] in run_sh
    for corpus in ("stdlib", "django_docs"):
        cfg = compose(["experiment=length_extrapolation", "trainer.max_steps=1500", "seed=0", "optim.lr=8e-3",
                       f"data={corpus}", "data.val_windows=512", "evaluate_after_fit=false", "eval.at=[]", *arm])
        validate(cfg)
        assert cfg.optim.lr == 8e-3 and cfg.data.source == corpus and cfg.trainer.max_steps == 1500
