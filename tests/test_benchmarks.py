"""The benchmark scripts run end to end (tiny sizes); the exactness of the fast paths they motivated is
tested with the attention (tests/test_attention.py) and RoPE (tests/test_encodings.py)."""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THROUGHPUT = ROOT / "experiments" / "benchmarks" / "throughput.py"
EVAL_MEMORY = ROOT / "experiments" / "benchmarks" / "eval_memory.py"
SCHEMES = ["nope", "rope", "alibi", "t5_bias", "learned", "sinusoidal"]
TINY_ARGS = "--d 32 --layers 2 --heads 2 --seq 32 --batch 2 --vocab 64 --steps 3 --warmup 1 --threads 1"
# 6N + 12 l d T of the TINY model, counted by hand: N = tied embedding V*d + per layer (qkv 3d^2, out d^2,
# MLP 8d^2, two LayerNorm weights 2d) + final LayerNorm d; position tables are not in N.
D, LAYERS, SEQ, VOCAB = 32, 2, 32, 64
TINY_FLOPS_PER_TOKEN = 6 * (VOCAB * D + LAYERS * (12 * D * D + 2 * D) + D) + 12 * LAYERS * D * SEQ  # 185_280
TINY = [*TINY_ARGS.split(), "--peak-n", "256", "--peak-repeats", "2"]
HAS_PEER = importlib.util.find_spec("x_transformers") is not None


def _run(args: list[str], tmp_path: Path, capsys, monkeypatch, block_peer: bool = False) -> tuple[str, dict]:
    """throughput.py's main() with the tests' arguments, in this process (the script's own work; its command line is
    argparse over the same list): what it printed, and the JSON it wrote. In-process rather than `python
    throughput.py`: a subprocess re-imports torch and Lightning (~5 CPU-s each time) for the same rows."""
    out = tmp_path / "bench.json"
    if block_peer:  # x_transformers as if not installed: sys.modules[name] = None makes `import` raise ImportError
        monkeypatch.setitem(sys.modules, "x_transformers", None)
    lightning_log = logging.getLogger("lightning.pytorch")
    level = lightning_log.level
    try:
        _load("throughput").main([*TINY, "--json", str(out), *args])
    finally:
        lightning_log.setLevel(level)  # the script quiets Lightning's banners for its own fits
    return capsys.readouterr().out, json.loads(out.read_text())


@pytest.mark.slow
def test_throughput_runs_every_scheme_and_reports_tokens_and_mfu(tmp_path, capsys, monkeypatch):
    stdout, result = _run([], tmp_path, capsys, monkeypatch)
    impls = ["plain", "lightning"] + (["x-transformers"] if HAS_PEER else [])
    rows = {(r["scheme"], r["impl"]): r for r in result["rows"]}
    assert set(rows) == {(s, i) for s in SCHEMES for i in impls}
    assert result["peak_flops"] > 0 and result["peer"] is HAS_PEER
    for (scheme, impl), r in rows.items():
        assert r["tokens_per_s"] > 0, r
        assert r["mfu"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / result["peak_flops"]), r
        if impl in ("plain", "lightning"):  # pelab's model, every scheme: the same non-position parameters
            assert r["flops_per_token"] == TINY_FLOPS_PER_TOKEN, r
        assert r["vs_plain"] > 0 and r["overhead_vs_nope"] is not None
        if HAS_PEER:
            assert r["vs_peer"] > 0
        # one printed table line per row
        assert any(line.split()[:2] == [scheme, impl] for line in stdout.splitlines()), stdout
    assert rows[("nope", "plain")]["overhead_vs_nope"] == 0.0
    assert rows[("nope", "plain")]["vs_plain"] == 1.0
    # same model, same formula: the plain loop and Lightning report the same FLOPs/token
    assert rows[("rope", "plain")]["flops_per_token"] == rows[("rope", "lightning")]["flops_per_token"]


@pytest.mark.slow
def test_throughput_without_x_transformers_skips_the_peer_column_and_says_so(tmp_path, capsys, monkeypatch):
    stdout, result = _run(["--pe", "nope", "alibi"], tmp_path, capsys, monkeypatch, block_peer=True)
    assert "x-transformers not importable" in stdout and "peer column skipped" in stdout
    assert result["peer"] is False
    assert {r["impl"] for r in result["rows"]} == {"plain", "lightning"}
    assert {r["scheme"] for r in result["rows"]} == {"nope", "alibi"}
    assert all(r["vs_peer"] is None and r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in result["rows"])


@pytest.mark.slow
def test_eval_memory_measures_each_case_in_its_own_process(tmp_path):
    out = tmp_path / "mem.json"
    args = "--pe learned alibi --lengths 96 --d 32 --layers 1 --heads 2 --vocab 64 --train-len 32 --threads 1"
    cmd = [sys.executable, str(EVAL_MEMORY), *args.split(), "--json", str(out)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["scheme"], r["length"]) for r in rows] == [("learned", 96), ("alibi", 96)]
    for r in rows:
        assert "error" not in r, r
        # learned got a table as long as the evaluated window; NLL of random tokens near ln(64)
        assert r["peak_rss"] >= r["rss_before"] > 0 and r["seconds"] > 0
        assert 3.0 < r["nll_per_token"] < 5.5
    assert "target < 4.0 GiB: met" in proc.stdout


GPU_CHECK = ROOT / "experiments" / "benchmarks" / "gpu_check.sh"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_parses_and_its_python_pieces_run_on_cpu(tmp_path):
    """gpu_check.sh is valid bash; the pieces it calls run at tiny sizes on CPU with the arguments it passes
    (all of them: `bash gpu_check.sh --cpu-smoke`, README), and `collect` joins their JSONs into one."""
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)], check=False, capture_output=True).returncode == 0
    gpu_check = _load("gpu_check")
    gpu_check.main(["steps", "--cpu-smoke", "--schemes", "nope", "alibi", "t5_bias", "--json", str(tmp_path / "steps.json")])
    gpu_check.main(["mfu", "--cpu-smoke", "--no-compile", "--mfu-schemes", "nope", "--json", str(tmp_path / "mfu.json")])
    gpu_check.main(["attention", "--cpu-smoke", "--schemes", "t5_bias", "--flex-dtypes", "--json",
                    str(tmp_path / "attention.json")])
    _load("eval_memory").main(["--in-process", "--pe", "alibi", "kerple", "--lengths", "64", "--d", "32", "--layers",
                               "1", "--heads", "2", "--vocab", "64", "--train-len", "32", "--json",
                               str(tmp_path / "eval_memory.json")])
    report = gpu_check.main(["collect", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_check.json").read_text())["steps"] == report["steps"]
    steps = report["steps"]["rows"]
    assert set(steps) == {"nope", "alibi", "t5_bias"} and steps["nope"]["vs_nope"] == 1.0
    # the path each scheme's training step took, as recorded by the attention dispatch
    assert list(steps["nope"]["attention"]) == ["sdpa_causal"] and list(steps["alibi"]["attention"]) == ["sdpa_mask"]
    assert list(steps["t5_bias"]["attention"]) == ["explicit"]
    mfu = report["mfu"]
    assert mfu["matmul_flops"] > 0 and 0 < mfu["rows"]["nope"]["mfu_vs_matmul"]
    assert mfu["rows"]["nope"]["mfu_vs_spec"] == pytest.approx(
        mfu["rows"]["nope"]["flops_per_token"] * mfu["rows"]["nope"]["tokens_per_s"] / 989e12)
    att = report["attention"]["rows"]["t5_bias"]
    assert att["bias_form"] == "DistanceBias" and att["sdpa_err_fp32"] < 1e-5 and att["sdpa_err_bf16"] < 0.1
    memory = report["eval_memory"]["rows"]
    assert [(r["scheme"], r["length"]) for r in memory] == [("alibi", 64), ("kerple", 64)]
    assert all("error" not in r and 3.0 < r["nll_per_token"] < 5.5 for r in memory)
    assert report["train"]["status"] is None and report["probe_speed"]["error"]  # sections not run: said so


@pytest.mark.parametrize("study", ["length_extrapolation", "lost_in_the_middle", "context_extension"])
def test_gpu_study_plans_reach_twenty_tokens_per_parameter(study):
    """The GPU versions of the studies (unrun: no GPU lent): every scheme and seed, >= 20 tokens per parameter."""
    out = subprocess.run([sys.executable, str(ROOT / "experiments/gpu/run_study.py"), study, "--plan"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    plan = json.loads(out[: out.index("}") + 1])
    assert plan["tokens_per_param"] >= 20 and plan["runs"] == len(out.strip().splitlines()) - len(
        out[: out.index("}") + 1].splitlines())


@pytest.mark.slow
def test_gpu_study_runner_smoke_on_cpu(tmp_path):
    """The runner's machinery on the CPU: two tiny parents of the context-extension study, then two children
    (extend.from each parent), in parallel processes; every run finishes."""
    res = subprocess.run([sys.executable, str(ROOT / "experiments/gpu/run_study.py"), "context_extension",
                          "--cpu-smoke", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    summaries = list((tmp_path / "context_extension").rglob("summary.json"))
    assert len(summaries) == 4 and all(json.loads(p.read_text())["status"] == "ok" for p in summaries)


def test_timing_targets_runs_a_target_and_records_it_against_its_limit(tmp_path):
    """experiments/benchmarks/timing_targets.py (the wall-clock limits that left the tests) runs and writes its rows;
    the cheapest target only (the others are minutes of subprocesses)."""
    result = _load("timing_targets").main(["--only", "cache_reuse", "--json", str(tmp_path / "t.json")])
    assert json.loads((tmp_path / "t.json").read_text()) == result
    (row,) = result["rows"]
    assert row["target"] == "cache_reuse_s" and row["value"] >= 0 and row["limit"] == "< 1"
    assert isinstance(row["met"], bool) and len(row["loadavg_before"]) == 3
