"""`python -m pelab.report collect`, `refill`, `cost` and `progress`: the steps between a study's sweep and its findings
page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pelab.report.cli import main

PAGE = """# A study

Prose the refill keeps.

<!-- generated: python -m pelab.report runs --out {out} -->
**Perplexity by length**

| row | ppl |
|---|---|
| rope | 9.99 |

**Claims**

- an old claim
<!-- end generated -->

After the block.
"""

REPORT = """# PELab report

**Perplexity by length** (mean over seeds)

A caption paragraph the page leaves out.

| row | ppl |
|---|---|
| rope | 3.94 |
| nope | 6.40 |

**Claims**

- rope below nope at 128 (resolved)
"""


def writes_report(out: Path):
    """The report command's contract, stubbed: it writes <--out>/report.md (REPORT)."""
    def report(argv: list[str]) -> int:
        out.mkdir(exist_ok=True)
        (out / "report.md").write_text(REPORT)
        return 0
    return report


def job(sweep: Path, name: str, status: str | None, extra: dict[str, str] | None = None) -> Path:
    folder = sweep / name
    files = {"csv/metrics.csv": "step,loss\n1,2\n", ".hydra/overrides.yaml": "- seed=0\n",
             "checkpoints/last.ckpt": "weights", **(extra or {})}
    files["summary.json"] = json.dumps({"status": status}) if status else "{truncated"
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    return folder


def test_collect_copies_the_small_files_of_finished_jobs_only(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    job(sweep, "0_rope-s0", "ok", {"provenance-2026-12-06T01-43-21.diff": "diff"})
    job(sweep, "1_rope-s1", "running")
    job(sweep, "2_rope-s2", None)  # an unreadable summary.json: not a finished job
    (sweep / "multirun.yaml").write_text("hydra: {}")
    assert main(["collect", str(sweep), str(tmp_path / "runs")]) == 0
    assert "collected 1 finished jobs" in capsys.readouterr().out
    got = sorted(p.relative_to(tmp_path / "runs").as_posix() for p in (tmp_path / "runs").rglob("*") if p.is_file())
    assert got == ["0_rope-s0/.hydra/overrides.yaml", "0_rope-s0/csv/metrics.csv",
                   "0_rope-s0/provenance-2026-12-06T01-43-21.diff", "0_rope-s0/summary.json"]


def test_collect_of_one_finished_run_folder_copies_it_into_dest_itself(tmp_path, capsys):
    """A single run (hydra.run.dir, e.g. one seed's parent in the context-extension study) collects as the jobs of a
    sweep do, into `dest` itself, so that one seed can be collected without the others; an unfinished one: nothing."""
    one = job(tmp_path / "parents", "s6", "ok")
    job(tmp_path / "parents", "s7", "running")
    assert main(["collect", str(one), str(tmp_path / "runs" / "parents" / "s6")]) == 0
    assert "collected 1 finished jobs" in capsys.readouterr().out
    got = sorted(p.relative_to(tmp_path / "runs").as_posix() for p in (tmp_path / "runs").rglob("*") if p.is_file())
    assert got == ["parents/s6/.hydra/overrides.yaml", "parents/s6/csv/metrics.csv", "parents/s6/summary.json"]
    assert main(["collect", str(tmp_path / "parents" / "s7"), str(tmp_path / "runs" / "parents" / "s7")]) == 0
    assert "collected 0 finished jobs" in capsys.readouterr().out and not (tmp_path / "runs" / "parents" / "s7").exists()

def test_restore_puts_back_the_finished_runs_under_that_root_only_and_keeps_what_is_there(tmp_path, capsys):
    sweep, runs = tmp_path / "new" / "sweep-rope", tmp_path / "runs"
    for name, status, out in [("0_rope-s0", "ok", sweep), ("1_rope-s1", "ok", sweep), ("2_rope-s2", "running", sweep),
                              ("0_alibi-s0", "ok", tmp_path / "new" / "sweep-alibi")]:
        job(runs, name, status).joinpath("summary.json").write_text(
            json.dumps({"status": status, "output_dir": str(out / name)}))
    job(sweep, "1_rope-s1", "ok").joinpath("summary.json").write_text(json.dumps({"status": "ok", "here": True}))
    assert main(["restore", str(runs), str(tmp_path / "new")]) == 0
    assert "restored 2 finished jobs" in capsys.readouterr().out
    assert sorted(p.name for p in sweep.iterdir()) == ["0_rope-s0", "1_rope-s1"]
    assert (tmp_path / "new" / "sweep-alibi" / "0_alibi-s0" / "summary.json").is_file()
    assert main(["restore", str(runs), str(tmp_path / "other")]) == 0  # a root none of them names: nothing
    assert "restored 0 finished jobs" in capsys.readouterr().out and not (tmp_path / "other").exists()
    assert json.loads((sweep / "0_rope-s0" / "summary.json").read_text())["output_dir"] == str(sweep / "0_rope-s0")
    assert (sweep / "0_rope-s0" / "csv" / "metrics.csv").is_file()
    assert json.loads((sweep / "1_rope-s1" / "summary.json").read_text())["here"]  # a finished run there: kept
    assert main(["restore", str(tmp_path / "nowhere"), str(sweep)]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_collect_of_a_missing_sweep_is_one_line(tmp_path, capsys):
    assert main(["collect", str(tmp_path / "nowhere"), str(tmp_path / "runs")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_cost_sums_the_finished_runs_cpu_and_wall_hours_per_folder(tmp_path, capsys):
    def run(folder: Path, name: str, summary: dict) -> None:
        (folder / name).mkdir(parents=True)
        (folder / name / "summary.json").write_text(json.dumps(summary))

    launches = [{"wall_seconds": 1800.0, "cpu_seconds": 1700.0}, {"wall_seconds": 1800.0, "cpu_seconds": 1900.0}]
    run(tmp_path / "a", "0_rope-s0", {"status": "ok", "cpu_seconds_total": 3600.0, "wall_seconds_total": 3600.0,
                                      "launches": launches})  # resumed once: both launches count
    run(tmp_path / "a", "1_rope-s1", {"status": "ok", "cpu_seconds_total": 1800.0, "wall_seconds_total": 1800.0})
    run(tmp_path / "a", "2_rope-s2", {"status": "running", "cpu_seconds_total": 900.0, "wall_seconds_total": 900.0})
    run(tmp_path / "b", "0_old", {"status": "ok", "launches": [{"wall_seconds": 7200.0}]})  # before cpu_seconds
    assert main(["cost", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cost.md")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [f"| {tmp_path / 'a'} | 2 | 2 | 1.50 | 1.50 |", f"| {tmp_path / 'b'} | 1 | 0 | n/a | 2.00 |",
                         "| all | 3 | 2 | 1.50 | 3.50 |"]
    assert (tmp_path / "cost.md").read_text().splitlines() == lines
    assert main(["cost", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a folder" in capsys.readouterr().err


def test_a_study_roots_sweeps_are_found_at_any_depth(tmp_path):
    """A study's root stands for every sweep under it, its own sweep-* and an arm's (<root>/lr1e-3/sweep-*), and for
    each folder of single runs (hydra.run.dir: no multirun.yaml) outside them; a sweep named itself is itself."""
    from pelab.report.generated import study_sweeps

    for sweep in ("sweep-rope.stdlib", "lr1e-3/sweep-rope.stdlib"):
        (tmp_path / sweep / "0_rope-s0").mkdir(parents=True)
        (tmp_path / sweep / "multirun.yaml").write_text("hydra: {}\n")
        (tmp_path / sweep / "0_rope-s0" / "summary.json").write_text("{}")
    (tmp_path / "ruler" / "rope-vt-L128-s0").mkdir(parents=True)
    (tmp_path / "ruler" / "rope-vt-L128-s0" / "summary.json").write_text("{}")
    assert study_sweeps([tmp_path]) == [tmp_path / "lr1e-3/sweep-rope.stdlib", tmp_path / "ruler",
                                        tmp_path / "sweep-rope.stdlib"]
    assert study_sweeps([tmp_path / "sweep-rope.stdlib"]) == [tmp_path / "sweep-rope.stdlib"]
    # single runs beside sweeps (the context extension's layout): each folder holding run folders, and each sweep
    ce = tmp_path / "ce"
    for run in ("parents/s0", "parents/s1", "free/s0/yarn", "free/s0/ntk", "full/s0/0_rope-s0"):
        (ce / run).mkdir(parents=True)
        (ce / run / "summary.json").write_text("{}")
    (ce / "full/s0/multirun.yaml").write_text("hydra: {}\n")
    assert study_sweeps([ce]) == [ce / "free/s0", ce / "full/s0", ce / "parents"]


@pytest.mark.slow
def test_progress_counts_a_sweeps_jobs_by_state_and_estimates_the_cpu_left(sweep, tmp_path, capsys):
    """The jobs of a sweep by state, from its job folders and the multirun.yaml Hydra wrote (the shared 2 x 2
    multirun's, real): finished, running (a live process holds the folder), stopped (killed: its lock's process is
    gone), not started; CPU-hours spent, and left at the finished runs' mean."""
    from pelab.report.generated import sweep_jobs
    from pelab.runs.folder import LOCK

    root = tmp_path / "sweep"
    root.mkdir()
    shutil.copy(sweep / "multirun.yaml", root)  # pe=rope,alibi seed=0,1: four jobs
    assert sweep_jobs(sweep) == sweep_jobs(root) == 4 == len(list(sweep.glob("*/summary.json")))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])

    real = sorted(sweep.glob("*/.hydra/overrides.yaml"))  # the four jobs' overrides, as Hydra wrote them

    def job(name: str, summary: dict, overrides: str, holder: int | None = None) -> None:
        (root / name / ".hydra").mkdir(parents=True)
        (root / name / ".hydra" / "overrides.yaml").write_text(overrides)
        (root / name / "summary.json").write_text(json.dumps({"config": {"trainer": {"max_steps": 10}}, **summary}))
        if holder is not None:
            (root / name / LOCK).write_text(f"{holder}\n")

    try:
        job("0_done", {"status": "ok", "global_step": 10, "cpu_seconds_total": 3600.0}, real[0].read_text())
        job("1_training", {"status": "running", "global_step": 5, "cpu_seconds_total": 1800.0}, real[1].read_text(),
            alive.pid)
        job("2_killed", {"status": "running", "global_step": 2, "cpu_seconds_total": 900.0}, real[2].read_text(),
            dead.pid)
        # a job of an earlier launch of the folder with other seeds: finished, not one of this launch's four
        job("0_earlier", {"status": "ok", "global_step": 10, "cpu_seconds_total": 3600.0},
            real[3].read_text().replace("seed=", "seed=7") + "- extra=1\n")
        assert main(["progress", str(root)]) == 0
        first = capsys.readouterr().out
        assert main(["progress", str(tmp_path)]) == 0  # the study's root: the sweep inside it, the same table
        assert capsys.readouterr().out == first
        assert main(["progress", str(root), str(root)]) == 0  # two sweeps: a last row sums them
        assert capsys.readouterr().out.splitlines()[4:7] == [
            "| all | 10 | 4 | 2 | 2 | 0 | 2 | 5.50 | 4.50 |", "",
            ("At the 2 job(s) running now, each on a core of its own: about 2.25 hours of wall time left (longer on a "
            "busier machine).")]
        print(first, end="")
    finally:
        alive.kill()
        alive.wait()
    out = capsys.readouterr().out.splitlines()
    # one job not started; left: 3600 for it, 3600 - 1800 and 3600 - 900 for the others = 8100 s; five jobs: the
    # latest launch's four and the earlier launch's one
    assert out[2] == f"| {root} | 5 | 2 | 1 | 1 | 0 | 1 | 2.75 | 2.25 |"
    assert out[4:6] == [("At the 1 job(s) running now, each on a core of its own: about 2.25 hours of wall time left "
                        "(longer on a busier machine)."), ""]
    assert out[6:] == [f"- {root / '1_training'}: running, pid {alive.pid}, step 5 of 10",
                       f"- {root / '2_killed'}: stopped, step 2 of 10"]
    (root / "multirun.yaml").unlink()  # not a Hydra sweep folder: the counts it cannot know are n/a
    assert main(["progress", str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[2] == f"| {root} | n/a | 2 | 0 | 2 | 0 | n/a | 2.75 | n/a |"
    assert main(["progress", str(tmp_path / "nowhere")]) == 2
    assert "nowhere is not a folder" in capsys.readouterr().err


def test_refill_replaces_each_titled_table_and_claim_list_and_keeps_the_rest(tmp_path, monkeypatch):
    from pelab.report.generated import refill

    out = tmp_path / "report"
    page = tmp_path / "pages" / "study.md"
    page.parent.mkdir()
    page.write_text(PAGE.format(out=out))
    (tmp_path / "pages" / "other.md").write_text("no block here\n")
    calls = []

    def report(argv: list[str]) -> int:  # the report command's contract: it writes <--out>/report.md
        calls.append(argv)
        out.mkdir(exist_ok=True)
        (out / "report.md").write_text(REPORT)
        return 0

    assert refill([tmp_path / "pages"], report) == [page]
    assert calls == [["runs", "--out", str(out)]]
    text = page.read_text()
    assert "| rope | 3.94 |\n| nope | 6.40 |\n" in text and "9.99" not in text
    assert "- rope below nope at 128 (resolved)\n" in text and "an old claim" not in text
    assert "A caption paragraph" not in text  # the page keeps its own words between title and table
    assert text.startswith("# A study\n\nProse the refill keeps.") and text.endswith("After the block.\n")


def test_refill_names_a_title_the_report_lacks(tmp_path):
    import pytest

    from pelab.errors import ReportError
    from pelab.report.generated import refill

    out = tmp_path / "report"
    page = tmp_path / "study.md"
    page.write_text(PAGE.format(out=out).replace("**Perplexity by length**", "**Renamed table**"))

    report = writes_report(out)

    with pytest.raises(ReportError, match="study.md: the report has no table titled 'Renamed table'"):
        refill([page], report)
    assert "Renamed table" in page.read_text()  # the page is left as it was


def test_refill_names_a_title_with_nothing_under_it_and_never_fills_the_next_title_in_its_place(tmp_path):
    """A placeholder title left bare (the claims written with no `- ` line) above another title: the refill used to
    read the next title as the first one's caption and put the claims in the table's place, dropping that title."""
    import pytest

    from pelab.errors import ReportError
    from pelab.report.generated import TITLED, refill

    out = tmp_path / "report"
    page = tmp_path / "study.md"
    bare = PAGE.format(out=out).replace("**Claims**\n\n- an old claim\n", "**Claims**\n\n")
    bare = bare.replace("**Perplexity by length**", "**Claims**\n\n**Perplexity by length**", 1).replace(
        "**Claims**\n\n<!-- end", "<!-- end")
    page.write_text(bare)
    assert [m["title"] for m in TITLED.finditer(bare)] == ["Perplexity by length"]  # no title eats the next one

    report = writes_report(out)

    with pytest.raises(ReportError, match="study.md: the title 'Claims' has no table .* or list .* under it"):
        refill([page], report)
    assert page.read_text() == bare  # the page is left as it was


def test_refill_of_a_failing_report_is_one_line_naming_the_page(tmp_path, capsys, monkeypatch):
    page = tmp_path / "study.md"
    page.write_text(PAGE.format(out=tmp_path / "report"))
    (tmp_path / "runs").mkdir()  # no runs in it: the report command fails
    monkeypatch.chdir(tmp_path)
    assert main(["refill", str(page)]) == 2
    assert "study.md: python -m pelab.report runs --out" in capsys.readouterr().err
