"""The result table a run ends with (pelab.result_table): golden output for a text run, a retrieval-only
run and a mixed run; at most 80 columns; every probe row with its n."""

from __future__ import annotations

from pelab.result_table import result_table

EX = {"split": "test", "blocks": 16, "lengths": [128, 256]}


def text_run() -> dict:
    m = {"val/ppl": 5.1234, "val/ppl_lo": 4.9, "val/ppl_hi": 5.3, "val/loss": 1.6338,
         "extrap/ppl@128": 5.0, "extrap/ppl_lo@128": 4.8, "extrap/ppl_hi@128": 5.2, "extrap/ppl_ratio@128": 1.0,
         "extrap/ppl@256": 6.5, "extrap/ppl_lo@256": 6.2, "extrap/ppl_hi@256": 6.8, "extrap/ppl_ratio@256": 1.3,
         "extrap/ppl_ratio_lo@256": 1.27, "extrap/ppl_ratio_hi@256": 1.33, "extrap/ppl_sliding@256": 6.1}
    return {"name": "rope-tiny-L128-s0", "status": "ok", "global_step": 160, "wall_seconds": 123.4,
            "config": {"data": {"recall_mix": 0.0}}, "metrics": m, "evaluation": {"extrapolation": EX},
            "output_dir": "outputs/runs/x"}


def recall_run(mix: float) -> dict:
    m = {"val/ppl": 16208.1, "train/retrieval_acc": 0.984, "train/steps_to_criterion": 300.0,
         "probe/mqar/acc@128": 0.984, "probe/mqar/acc_lo@128": 0.96, "probe/mqar/acc_hi@128": 0.99,
         "probe/mqar_offset/acc@256": 0.5, "probe/mqar_offset/acc_lo@256": 0.4, "probe/mqar_offset/acc_hi@256": 0.6,
         "extrap/ppl@128": 9000.0, "extrap/ppl_ratio@128": 1.0}
    probes = {"rows": [{"kind": "mqar", "length": 128, "n": 40} for _ in range(5)],
              "offset": [{"kind": "mqar_offset", "length": 256, "n": 100}]}
    return {"name": "rope-recall-L128-s2", "status": "ok", "global_step": 300, "wall_seconds": 64.0,
            "config": {"data": {"recall_mix": mix}}, "metrics": m, "output_dir": "outputs/runs/y",
            "evaluation": {"extrapolation": EX, "probes": probes}}


def test_a_text_run_leads_with_its_perplexity():
    assert result_table(text_run()) == """Result of rope-tiny-L128-s0 (ok, step 160, 123 s)
  val/ppl 5.12 [4.90, 5.30]  (val/loss 1.6338)
  text, test split: 16 blocks of 256 tokens, [95% interval]
  length       ppl [95% interval]        ratio [95% interval]   sliding
     128      5.00 [4.80, 5.20]         1.00                      n/a
     256      6.50 [6.20, 6.80]         1.30 [1.27, 1.33]        6.10
  run folder: outputs/runs/x"""


def test_a_retrieval_only_run_does_not_headline_an_untrained_text_perplexity():
    table = result_table(recall_run(1.0))
    assert table == """Result of rope-recall-L128-s2 (ok, step 300, 64 s)
  retrieval criterion met at step 300 (in-window accuracy 0.984)
  probe        length   acc   interval          n (x depths)
  mqar            128  0.98   [0.96, 0.99]     40x5
  mqar_offset     256  0.50   [0.40, 0.60]     100
  text: not measured (data.recall_mix=1: the model was trained on recall rows only)
  run folder: outputs/runs/y"""
    assert "16208" not in table


def test_a_mixed_run_leads_with_retrieval_then_text_and_fits_80_columns():
    table = result_table({**recall_run(0.25), "wandb": {"mode": "offline", "dir": "outputs/runs/y/wandb/offline-run-1"}})
    lines = table.splitlines()
    assert lines[1].startswith("  retrieval criterion met") and any(x.startswith("  val/ppl 16208.10") for x in lines)
    assert lines.index("  probe        length   acc   interval          n (x depths)") < next(
        i for i, x in enumerate(lines) if x.startswith("  val/ppl"))
    assert max(len(x) for x in [*lines, *result_table(text_run()).splitlines()]) <= 80
