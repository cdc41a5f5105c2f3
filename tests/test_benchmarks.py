"""The benchmark scripts run end to end (tiny sizes), and the attention fast path they motivated is exact."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from pelab.model.attention import causal_attention, causal_bias, reference_attention

ROOT = Path(__file__).resolve().parents[1]
THROUGHPUT = ROOT / "experiments" / "benchmarks" / "throughput.py"
EVAL_MEMORY = ROOT / "experiments" / "benchmarks" / "eval_memory.py"
SCHEMES = ["nope", "rope", "alibi", "t5_bias", "learned", "sinusoidal"]
TINY_ARGS = "--d 32 --layers 2 --heads 2 --seq 32 --batch 2 --vocab 64 --steps 3 --warmup 1 --threads 1"
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
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1.5, r
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


def _kernels(fn) -> set[str]:
    with profile() as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_shared_bias_takes_the_fused_cpu_kernel_and_matches_reference():
    """A (H, T, T) bias is passed to SDPA as a 4-D view: the fused (flash) CPU kernel, not the math path,
    with the reference attention's numbers and gradients."""
    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 40, 8
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    bias = torch.randn(H, T, T)
    out = causal_attention(q, k, v, causal_bias(bias), chunk_size=16)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = reference_attention(q, k, v, bias)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    used = _kernels(lambda: causal_attention(q, k, v, causal_bias(bias)).sum().backward())
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in used
    assert "aten::_scaled_dot_product_attention_math" not in used


@pytest.mark.parametrize("chunk", [10, 64])
def test_learned_bias_takes_the_explicit_path_with_reference_gradients(chunk):
    """A bias that requires grad (T5's table) goes through explicit_attention, in query chunks, with the
    reference attention's output and gradients (bias and q, k, v)."""
    torch.manual_seed(1)
    B, H, T, Dh = 2, 2, 24, 8
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    bias = torch.randn(H, T, T, requires_grad=True)
    out = causal_attention(q, k, v, causal_bias(bias), chunk_size=chunk)
    ref = reference_attention(q, k, v, bias)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (bias, q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (bias, q, k, v))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    g = grads[0]
    used = _kernels(lambda: causal_attention(q, k, v, causal_bias(bias), chunk_size=chunk).sum().backward())
    assert "aten::_scaled_dot_product_attention_math" not in used
    assert g.triu(1).abs().max() == 0  # future keys get no gradient
    assert g.tril().abs().sum() > 0


def _rotary_reference(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, base: float = 10000.0):
    """The textbook half-split rotation through plain autograd ops: x*cos + rotate_half(x)*sin."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    f = pos.double()[..., None] * inv_freq  # (..., T, d/2)
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    if pos.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    xr, rest = x[..., :rotary_dim].double(), x[..., rotary_dim:].double()
    x1, x2 = xr.chunk(2, dim=-1)
    rot = xr * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((rot, rest), dim=-1)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("per_batch", [False, True])
def test_rope_rotation_and_its_gradient_match_the_textbook_formula(fraction, per_batch):
    """RoPE's one-buffer rotation with its inverse-rotation backward equals autograd through the formula."""
    from pelab.encodings.rotary import RoPE

    torch.manual_seed(0)
    B, H, T, Dh = 2, 3, 20, 16
    pe = RoPE(H * Dh, H, rotary_fraction=fraction)
    pos = torch.stack([torch.arange(T), torch.arange(7, 7 + T)]) if per_batch else torch.arange(3, 3 + T)
    q, k = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(2))
    rq, rk = pe.rotate(q, k, pos)
    w = torch.randn(B, H, T, Dh)
    gq, gk = torch.autograd.grad((rq * w).sum() + (rk * w.flip(0)).sum(), (q, k))
    eq, ek = _rotary_reference(q, pos, pe.rotary_dim), _rotary_reference(k, pos, pe.rotary_dim)
    fq, fk = torch.autograd.grad((eq * w).sum() + (ek * w.flip(0)).sum(), (q, k))
    torch.testing.assert_close(rq, eq.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rk, ek.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gq, fq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gk, fk, atol=1e-5, rtol=1e-5)


def test_rope_rotation_passes_gradcheck_in_float64():
    from pelab.encodings.rotary import apply_rotary

    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64, requires_grad=True)
    f = torch.rand(5, 3, dtype=torch.float64) * 6
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()  # 6 of 8 channels rotated
    # fp32 math inside (as in training), so compare against finite differences at fp32 precision
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin).double(), (x,), eps=1e-3, atol=1e-3)


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias"])
@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_per_distance_bias_matches_the_full_bias_and_reference(scheme, chunk):
    """The (H, 2T-1) per-distance table, viewed per query chunk, gives the reference attention's output and
    gradients (q, k, v and T5's learned table) for every chunking."""
    from pelab.encodings import build_encoding
    from pelab.model.attention import DistanceBias, distance_bias

    torch.manual_seed(0)
    B, H, T, Dh = 2, 4, 19, 8
    pe = build_encoding({"name": scheme}, d_model=H * Dh, n_heads=H)
    with torch.no_grad():
        for p in pe.parameters():  # T5's N(0, d^-0.5) init is small: make the bias matter
            p.mul_(10)
    pos = torch.arange(T)
    table = distance_bias(pe, T, pos.device)
    assert isinstance(table, DistanceBias) and table.table.shape == (H, 2 * T - 1)
    full = causal_bias(pe.score_bias(pos, pos)).mask  # (H, T, T) with -inf above the diagonal
    torch.testing.assert_close(table.chunk(5, 12)[0].flip(-2), full[:, 5:12, :12])

    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    params = [q, k, v, *pe.parameters()]
    out = causal_attention(q, k, v, distance_bias(pe, T, pos.device), chunk_size=chunk)
    ref = reference_attention(q, k, v, pe.score_bias(pos, pos))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(ref)
    for got, want in zip(
        torch.autograd.grad((out * w).sum(), params), torch.autograd.grad((ref * w).sum(), params)
    ):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["alibi", "t5_bias"])
def test_model_default_positions_use_the_per_distance_bias_with_identical_logits(scheme):
    """Default positions (start..start+T-1) take the per-distance path; explicit positions the full (H, T, T)
    bias; logits and gradients agree, with and without a start offset."""
    from pelab.encodings import build_encoding
    from pelab.model.attention import CausalBias, DistanceBias
    from pelab.model.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, n_layers=2, n_heads=2, d_model=16, attn_chunk_size=6)
    model = GPT(config, build_encoding({"name": scheme}, 16, 2))
    idx = torch.randint(0, 50, (2, 15))
    for start in (0, 40):
        pos = torch.arange(start, start + 15)
        assert isinstance(model.score_bias(pos, consecutive=True), DistanceBias)
        assert isinstance(model.score_bias(pos, consecutive=False), CausalBias)
        fast = model(idx, start=start)
        slow = model(idx, pos=pos)
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
        params = [p for p in model.parameters() if p.requires_grad]
        g_fast = torch.autograd.grad(fast.square().mean(), params)
        g_slow = torch.autograd.grad(slow.square().mean(), params)
        for a, b in zip(g_fast, g_slow):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
