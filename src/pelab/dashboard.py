"""`python -m pelab.dashboard --entity E --project P [--group G] [--dry-run]`: the W&B workspace as code.

Builds a saved W&B workspace view (package `wandb-workspaces`, optional: `pip install wandb-workspaces`)
with sections

* Extrapolation -- `extrap/ppl@L` for every evaluation length as bars, runs grouped by `pe.name`
  (mean, std band over seeds), the ppl ratios, sliding-window ppl, bits per byte, and each run's
  ppl-vs-length / loss-by-position figures;
* Probes -- per kind, `acc@L` and `lim_gap@L` by length with their intervals, the error split, the gold's
  rank, effective length and AUC, and the heatmap / depth-curve media;
* Training -- train/loss, val/ppl, train/tokens_per_sec, train/mfu, train/lr;

and the runs table grouped by `pe.name` with the headline metrics pinned.

The view is first described by a plain dict (`dashboard_spec`, pure, no W&B), then translated into
wandb-workspaces objects (`build_workspace`). `--dry-run` prints the spec as JSON (no server, no
package needed). The metric names come from the evaluation code itself (`metric_keys` builds empty
ExtrapolationResult / ProbeResult objects and asks them for their `.metrics()` keys), so the panels
always name exactly what the runs log.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pelab.errors import DashboardError
from pelab.metric_keys import lengths_of, metric_key

GROUP_BY = "pe.name"  # config key the runs are grouped by
TRAINING_METRICS = ["train/loss", "val/ppl", "val/ppl_lo", "val/ppl_hi", "train/tokens_per_sec", "train/mfu", "train/lr"]
# Logged only where the device's peak FLOP/s is known (GPUs), never on CPU.
DEVICE_DEPENDENT = {"train/mfu"}


# ---------------------------------------------------------------------------------------------
# metric names, from the evaluation code


def metric_keys(
    lengths: Sequence[int],
    kinds: Sequence[str],
    depths: Sequence[float] | None = None,  # None: pelab.evaluation.probes.DEFAULT_DEPTHS
    probe_lengths: Sequence[int] | None = None,
    protocols: Sequence[str] = ("nonoverlap", "sliding"),
    bpb: bool = True,
) -> list[str]:
    """The `extrap/...` and `probe/...` scalar keys that a run logs when evaluated at `lengths` (absolute
    token counts, the training length among them) and probed with `kinds` at `probe_lengths` (default:
    `lengths`), from the result classes' own `.metrics()`."""
    from pelab.evaluation.effective_length import EffectiveLengthRule, effective_length_metrics
    from pelab.evaluation.extrapolation import ExtrapolationCell, ExtrapolationResult
    from pelab.evaluation.probes import DEFAULT_DEPTHS, ProbeCell, ProbeResult

    depths = DEFAULT_DEPTHS if depths is None else depths
    lengths = sorted({int(L) for L in lengths})
    ex = ExtrapolationResult(
        train_length=lengths[0],
        lengths=lengths,
        protocols=tuple(protocols),
        stride=lengths[0],
        n_tokens=0,
        bytes_per_token=1.0 if bpb else None,
    )
    for L in lengths:
        for p in protocols:
            ex.cells[(L, p)] = ExtrapolationCell(length=L, protocol=p, stride=L)
    p_lengths = sorted({int(L) for L in (lengths if probe_lengths is None else probe_lengths)})
    pr = ProbeResult(kinds=list(kinds), depths=[float(d) for d in depths], lengths=p_lengths)
    for k in kinds:
        for d in depths:
            for L in p_lengths:
                pr.cells[(k, float(d), L)] = ProbeCell(kind=k, depth=float(d), length=L)
    return list(ex.metrics()) + list(pr.metrics()) + list(effective_length_metrics(pr, EffectiveLengthRule()))


def interleave(keys: Sequence[str], prefixes: Sequence[str]) -> list[str]:
    """Keys of several prefixes, by L, then in the order of ``prefixes`` (bars side by side per length)."""
    rows = [select(keys, p) for p in prefixes]
    return [k for group in zip(*rows) for k in group]


def select(keys: Sequence[str], prefix: str) -> list[str]:
    """Keys `prefix@L`, sorted by L."""
    return [metric_key(prefix, L) for L in lengths_of(keys, prefix)]


# ---------------------------------------------------------------------------------------------
# the spec (pure)


def _bars(title: str, metrics: list[str], group_by: str) -> dict:
    return {
        "type": "bar",
        "title": title,
        "metrics": metrics,
        "groupby": group_by,
        "aggregate": "mean",
        "range": "stddev",
    }


def _lines(title: str, metric: str, group_by: str) -> dict:
    return {
        "type": "line",
        "title": title,
        "x": "Step",
        "metrics": [metric],
        "groupby": group_by,
        "aggregate": "mean",
        "range": "stddev",
    }


def _media(title: str, keys: list[str]) -> dict:
    return {"type": "media", "title": title, "media_keys": keys}


def dashboard_spec(
    lengths: Sequence[int],
    kinds: Sequence[str],
    group: str | None = None,
    name: str | None = None,
    depths: Sequence[float] | None = None,  # None: pelab.evaluation.probes.DEFAULT_DEPTHS
    group_by: str = GROUP_BY,
    probe_lengths: Sequence[int] | None = None,
) -> dict:
    """The workspace view as a plain dict: name, runset (filter by W&B group, group by the config key
    `group_by`, pinned columns) and sections of panels. Each panel: `type` (bar | line | media), `title`,
    the metric keys (`metrics`) or media keys (`media_keys`), and the grouping.
    `lengths`: evaluation lengths in tokens (as in `extrap/ppl@{L}`); `kinds`: probe kinds, probed at
    `probe_lengths` (default: `lengths`) and `depths`."""
    if not lengths:
        raise DashboardError("dashboard needs at least one evaluation length (--lengths or --from)")
    keys = metric_keys(lengths, kinds, depths, probe_lengths)
    longest = max(int(L) for L in lengths)
    p_longest = max(int(L) for L in (lengths if probe_lengths is None else probe_lengths or lengths))
    extrap = {
        "name": "Extrapolation",
        "panels": [
            _bars("Perplexity by evaluation length (non-overlapping windows) with its 95% interval",
                  interleave(keys, ["extrap/ppl_lo", "extrap/ppl", "extrap/ppl_hi"]), group_by),
            _bars("ppl@L / ppl@training length with its 95% interval",
                  interleave(keys, ["extrap/ppl_ratio_lo", "extrap/ppl_ratio", "extrap/ppl_ratio_hi"]), group_by),
            _bars("Perplexity, sliding windows, with its 95% interval",
                  interleave(keys, ["extrap/ppl_sliding_lo", "extrap/ppl_sliding", "extrap/ppl_sliding_hi"]),
                  group_by),
            _bars("Bits per byte", select(keys, "extrap/bpb"), group_by),
            _media("ppl vs length (per run)", ["plots/ppl_vs_length"]),
            _media("Loss by position (per run)", ["plots/loss_by_position"]),
        ],
    }
    probes = {"name": "Probes", "panels": []}
    for k in kinds:
        probes["panels"] += [
            _bars(f"{k}: accuracy by length (mean over depths) with its 95% interval",
                  interleave(keys, [f"probe/{k}/acc_lo", f"probe/{k}/acc", f"probe/{k}/acc_hi"]), group_by),
            _bars(f"{k}: lost-in-the-middle gap by length with its 95% interval",
                  interleave(keys, [f"probe/{k}/lim_gap_lo", f"probe/{k}/lim_gap", f"probe/{k}/lim_gap_hi"]),
                  group_by),
            _bars(f"{k}: errors by length (another in-context value / not in the context)",
                  interleave(keys, [f"probe/{k}/other_in_context", f"probe/{k}/not_in_context"]), group_by),
            _bars(f"{k}: rank of the gold value among the context's values", select(keys, f"probe/{k}/rank"),
                  group_by),
            _bars(f"{k}: effective length (RULER's rule: eff_length, its threshold; mean >= 0.9: effective_length) "
                  "and area under accuracy vs length",
                  [m for m in (f"probe/{k}/eff_length", f"probe/{k}/eff_threshold", f"probe/{k}/effective_length",
                               f"probe/{k}/auc") if m in keys], group_by),
            _media(f"{k}: accuracy heatmaps", [f"plots/probe_{k}_heatmap"]),
            _media(f"{k}: accuracy by depth", [f"plots/probe_{k}_depth"]),
            _media(f"{k}: accuracy by length", [f"plots/probe_{k}_length"]),
        ]
    training = {"name": "Training", "panels": [_lines(m, m, group_by) for m in TRAINING_METRICS]}
    pinned = ["val/ppl", metric_key("extrap/ppl", longest), metric_key("extrap/ppl_ratio", longest)]
    pinned += [metric_key(f"probe/{k}/acc", p_longest) for k in kinds]
    return {
        "name": name or f"PELab — {group or 'all runs'}",
        "group": group,
        "runset": {
            "filters": {"Group": group} if group else {},
            "groupby": [group_by],
            "pinned_columns": [f"summary:{m}" for m in pinned if m in keys or m == "val/ppl"],
        },
        "sections": [s for s in (extrap, probes, training) if s["panels"]],
    }


def spec_metric_keys(spec: dict) -> set[str]:
    """Every scalar metric key the spec's panels plot (media keys excluded)."""
    return {m for s in spec["sections"] for p in s["panels"] for m in p.get("metrics", [])}


# ---------------------------------------------------------------------------------------------
# spec -> wandb-workspaces objects


def build_workspace(spec: dict, entity: str, project: str) -> Any:
    """Translate `spec` into a `wandb_workspaces.workspaces.Workspace` (not saved)."""
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as err:
        raise DashboardError(
            "the W&B dashboard needs the optional package wandb-workspaces: `pip install wandb-workspaces` "
            "(or use --dry-run to print the view's spec without it)"
        ) from err

    def panel(p: dict) -> Any:
        if p["type"] == "bar":
            return wr.BarPlot(
                title=p["title"],
                metrics=list(p["metrics"]),
                groupby=wr.Config(p["groupby"]),
                groupby_aggfunc=p["aggregate"],
                groupby_rangefunc=p["range"],
                orientation="v",
            )
        if p["type"] == "line":
            return wr.LinePlot(
                title=p["title"],
                x=p["x"],
                y=list(p["metrics"]),
                groupby=wr.Config(p["groupby"]),
                groupby_aggfunc=p["aggregate"],
                groupby_rangefunc=p["range"],
            )
        if p["type"] == "media":
            return wr.MediaBrowser(title=p["title"], media_keys=list(p["media_keys"]), gallery_axis="run")
        raise DashboardError(f"unknown panel type {p['type']!r}")

    runset = spec["runset"]
    filters = [ws.Metric(k) == v for k, v in runset["filters"].items()]
    return ws.Workspace(
        entity=entity,
        project=project,
        name=spec["name"],
        sections=[
            ws.Section(name=s["name"], panels=[panel(p) for p in s["panels"]], is_open=True)
            for s in spec["sections"]
        ],
        runset_settings=ws.RunsetSettings(
            filters=filters,
            groupby=[ws.Config(k) for k in runset["groupby"]],
            pinned_columns=list(runset["pinned_columns"]),
        ),
    )


# ---------------------------------------------------------------------------------------------
# lengths and kinds: from finished runs, or from the default config


def from_runs(folders: Sequence[str | Path]) -> dict[str, list]:
    """Union of the evaluated lengths, probe kinds, depths and probe lengths of the summaries under
    `folders`: the keyword arguments of `dashboard_spec`."""
    from pelab.report import find_jobs

    lengths: set[int] = set()
    p_lengths: set[int] = set()
    kinds: dict[str, None] = {}
    depths: set[float] = set()
    for job in find_jobs(folders):
        ev = job.summary.get("evaluation") or {}
        lengths |= {int(L) for L in (ev.get("extrapolation") or {}).get("lengths") or []}
        probes = ev.get("probes") or {}
        kinds.update(dict.fromkeys(probes.get("kinds") or []))
        depths |= {float(d) for d in probes.get("depths") or []}
        p_lengths |= {int(L) for L in probes.get("lengths") or []}
    if not lengths:
        raise DashboardError(
            f"no evaluated run (summary.json with evaluation) under {list(map(str, folders))}"
        )
    return {
        "lengths": sorted(lengths),
        "kinds": list(kinds),
        "depths": sorted(depths) or None,  # None: metric_keys' default
        "probe_lengths": sorted(p_lengths),
    }


def from_config(overrides: Sequence[str] = ()) -> dict[str, list]:
    """Lengths / kinds / depths / probe lengths that a run of `python train.py <overrides>` logs
    (composes conf/train.yaml): the keyword arguments of `dashboard_spec`."""
    from hydra import compose, initialize_config_dir

    import pelab.training.config  # noqa: F401 - imports the schemas, which store their nodes (pe/_RoPEConfig, ...)
    from pelab import CONF_DIR
    from pelab.evaluation.config import resolve_lengths, typed_evaluation

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    train_length = int(cfg.data.seq_len)
    ev, probes = typed_evaluation(cfg)
    return {
        "lengths": sorted(set(resolve_lengths(list(ev.lengths), train_length)) | {train_length}),
        "kinds": list(probes.kinds) if probes.enabled else [],
        "depths": [float(d) for d in probes.depths],
        "probe_lengths": resolve_lengths(list(probes.lengths), train_length),
    }


# ---------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pelab.dashboard", description=__doc__.split("\n\n")[0])
    p.add_argument("--entity", help="W&B entity (user or team); required unless --dry-run")
    p.add_argument("--project", default="pelab", help="W&B project (default: pelab)")
    p.add_argument("--group", default=None, help="show only this W&B group (a sweep: sweep-<date>-<time>)")
    p.add_argument("--name", default=None, help="view name (default: 'PELab — <group>')")
    p.add_argument(
        "--from",
        dest="from_runs",
        nargs="+",
        default=None,
        metavar="DIR",
        help="take lengths / probe kinds from the summary.json files under these run folders",
    )
    p.add_argument(
        "--lengths", default=None, help="comma-separated evaluation lengths in tokens, e.g. 128,256,512"
    )
    p.add_argument("--kinds", default=None, help="comma-separated probe kinds, e.g. kv,passkey ('' = none)")
    p.add_argument(
        "--overrides",
        nargs="*",
        default=[],
        help="train.py overrides to compose the default lengths/kinds from, e.g. data.seq_len=256",
    )
    p.add_argument(
        "--group-by",
        default=GROUP_BY,
        help="run-config key to group runs by (default pe.name; W&B-sweep runs: pe)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the view's spec as JSON; no W&B needed")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        layout = from_runs(args.from_runs) if args.from_runs else from_config(args.overrides)
        if args.lengths:
            layout["lengths"] = layout["probe_lengths"] = sorted(
                {int(x) for x in args.lengths.split(",") if x.strip()}
            )
        if args.kinds is not None:
            layout["kinds"] = [k.strip() for k in args.kinds.split(",") if k.strip()]
        spec = dashboard_spec(group=args.group, name=args.name, group_by=args.group_by, **layout)
        if args.dry_run:
            print(json.dumps(spec, indent=2, ensure_ascii=False))
            return 0
        if not args.entity:
            raise DashboardError("--entity is required to save a view (or pass --dry-run)")
        workspace = build_workspace(spec, args.entity, args.project)
        workspace.save()
        print(f"saved W&B view: {workspace.url}")
        return 0
    except DashboardError as err:
        print(f"pelab.dashboard: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
