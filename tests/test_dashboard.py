"""The W&B dashboard: its spec against the metric keys the runs really log, the workspace objects
built offline, and the message when wandb-workspaces is missing."""

from __future__ import annotations

import json
import sys

import pytest

from helpers.runs import summaries
from pelab import dashboard


@pytest.mark.slow
def test_dashboard_spec_names_exactly_the_metrics_the_runs_log(sweep, capsys):
    assert dashboard.main(["--dry-run", "--from", str(sweep), "--group", "g1"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in spec["sections"]] == ["Extrapolation", "Probes", "Training"]
    assert spec["runset"]["filters"] == {"Group": "g1"} and spec["runset"]["groupby"] == ["pe.name"]
    plotted = dashboard.spec_metric_keys(spec)
    for s in summaries(sweep):
        logged = set(s["metrics"])
        assert plotted - dashboard.DEVICE_DEPENDENT <= logged  # no panel names a key that is never logged
        # every evaluation scalar has a panel, except the probes' mean log-prob (in the tables only)
        evaluation = {k for k in logged if k.startswith(("extrap/", "probe/")) and "/logprob@" not in k}
        assert plotted - set(dashboard.TRAINING_METRICS) == evaluation
        assert set(dashboard.TRAINING_METRICS) - dashboard.DEVICE_DEPENDENT <= logged
        assert "train/mfu" not in logged  # CPU: no peak FLOP/s, so no MFU (GPU runs log it)
        media = {m for sec in spec["sections"] for p in sec["panels"] for m in p.get("media_keys", [])}
        assert media == {f"plots/{k}" for k in s["evaluation"]["plots"]}
        for col in spec["runset"]["pinned_columns"]:
            assert col.removeprefix("summary:") in logged


def test_dashboard_builds_workspace_objects_offline():
    ws = pytest.importorskip("wandb_workspaces.workspaces")
    layout = dashboard.from_config(["data.seq_len=128"])
    assert layout["lengths"] == [128, 256, 512, 1024] and layout["kinds"] == ["mqar"]  # the default run's
    spec = dashboard.dashboard_spec(group="sweep-1", **layout)
    workspace = dashboard.build_workspace(spec, "someone", "pelab")
    assert isinstance(workspace, ws.Workspace)
    assert [len(s.panels) for s in workspace.sections] == [len(s["panels"]) for s in spec["sections"]]
    view = workspace._to_model()  # the structure save() would upload; no server needed
    assert view.project == "pelab" and view.display_name == spec["name"]


def test_dashboard_without_the_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "wandb_workspaces.workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", None)
    spec = dashboard.dashboard_spec([32, 64], ["kv"])
    with pytest.raises(dashboard.DashboardError, match="pip install wandb-workspaces"):
        dashboard.build_workspace(spec, "someone", "pelab")
