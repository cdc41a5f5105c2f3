"""The benchmark scripts run end to end (tiny sizes); the exactness of the fast paths they motivated is
tested with the attention (tests/test_attention.py) and RoPE (tests/test_encodings.py)."""

from __future__ import annotations

import importlib.util
import json
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


def _run(args: list[str], tmp_path: Path, block_peer: bool = False) -> tuple[str, dict]:
    out = tmp_path / "bench.json"
    argv = [str(THROUGHPUT), *TINY, "--json", str(out), *args]
    if block_peer:
        # x_transformers as if not installed: sys.modules[name] = None makes `import` raise ImportError
        shim = (
            "import runpy, sys; sys.modules['x_transformers'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')"
        )
        cmd = [sys.executable, "-c", shim, *argv]
    else:
        cmd = [sys.executable, *argv]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.slow
def test_throughput_runs_every_scheme_and_reports_tokens_and_mfu(tmp_path):
    stdout, result = _run([], tmp_path)
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
def test_throughput_without_x_transformers_skips_the_peer_column_and_says_so(tmp_path):
    stdout, result = _run(["--pe", "nope", "alibi"], tmp_path, block_peer=True)
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
