"""pelab.summary: summary.json is written through `RunRecord`, whose keys are declared once (`FIELDS`): an
undeclared key or a value of another type fails where it is written; a run's record holds declared keys only."""

from __future__ import annotations

import json
import pickle

import pytest

from pelab.summary import FIELDS, RunRecord, write_summary


def test_a_declared_field_is_written_and_saved_as_json(tmp_path):
    record = RunRecord(status="running", name="rope-micro-L32-s0")
    record["metrics"] = {"val/ppl": 4.2}
    record.update(global_step=30)
    record.setdefault("launches", []).append({"status": "running"})
    record["evaluation/yarn"] = {"extrapolation": {}}  # a second evaluation's details
    saved = json.loads(write_summary(tmp_path, record).read_text())
    assert saved == {"status": "running", "name": "rope-micro-L32-s0", "metrics": {"val/ppl": 4.2},
                     "global_step": 30, "launches": [{"status": "running"}], "evaluation/yarn": {"extrapolation": {}}}


@pytest.mark.parametrize("write", [
    lambda r: r.__setitem__("metric", {}),  # a typo of metrics
    lambda r: r.update(gloabl_step=3),
    lambda r: r.setdefault("launch", []),
    lambda r: RunRecord(statu="ok"),
])
def test_an_undeclared_key_is_refused_where_it_is_written(write):
    with pytest.raises(KeyError, match="declare it in pelab.summary.FIELDS"):
        write(RunRecord())


def test_a_value_of_another_type_is_refused():
    with pytest.raises(TypeError, match="'global_step' holds int"):
        RunRecord()["global_step"] = "30"
    with pytest.raises(TypeError, match="'metrics' holds dict"):
        RunRecord(metrics=[1.0])


def test_the_record_survives_pickling_for_spawned_ranks():
    record = RunRecord(status="running", metrics={"val/ppl": 4.2})
    copy = pickle.loads(pickle.dumps(record))
    assert type(copy) is RunRecord and copy == record
    with pytest.raises(KeyError):
        copy["bogus"] = 1


def test_every_committed_run_record_holds_declared_fields_only():
    """The runs the studies committed were written before the declaration: it must describe them all (the
    `peer` comparison runs write their own extra keys, outside pelab)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "experiments"
    extra = {"peer", "train_curve"}
    seen = 0
    for path in root.rglob("summary.json"):
        record = json.loads(path.read_text())
        if extra & set(record):
            continue
        RunRecord(record)  # raises on an undeclared key or a value of another type
        seen += 1
    assert seen > 100 and set(FIELDS) >= {"status", "metrics", "config", "launches"}
