"""The report says which runs' code cannot be told: a launch from uncommitted changes whose diff was not kept and
that no rerun from its commit verified."""

from __future__ import annotations

import json

from pelab import report
from pelab.summary import write_summary

SHA = "0123456789abcdef0123456789abcdef01234567"


def run(folder, pe, dirty):
    write_summary(folder, {
        "status": "ok", "config": {"pe": {"name": pe}, "model": {"name": "tiny"}, "data": {"seq_len": 128}, "seed": 0},
        "provenance": {"code": {"git": SHA, "dirty": dirty}}, "launches": [{"dirty": dirty}],
        "metrics": {"val/ppl": 5.0}})


def test_runs_from_unkept_uncommitted_changes_are_named_until_a_rerun_verifies_them(tmp_path):
    run(tmp_path / "clean", "rope", False)
    run(tmp_path / "dirty", "alibi", True)
    run(tmp_path / "checked", "nope", True)
    (tmp_path / "checked" / "verified.json").write_text(json.dumps({"verified": True}))
    rep = report.build_report([tmp_path], tmp_path / "out")
    table = next(t for t in rep.tables if t.title == "Runs")
    runs, commit = {r[0]: r for r in table.rows}, table.columns.index("commit")
    assert runs["`clean`"][commit] == "`01234567`"
    assert runs["`dirty`"][commit] == "`01234567 (dirty-unverified)`"
    assert runs["`checked`"][commit] == "`01234567 (dirty-verified)`"
    assert "**Warning:** 1 run(s) were made from uncommitted changes that were not kept and not verified" in rep.markdown
    assert "`dirty`." in rep.markdown and "`checked`" not in rep.markdown.split("**Warning:** 1 run(s)")[1][:300]
