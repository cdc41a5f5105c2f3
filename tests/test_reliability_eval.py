"""The end-of-training evaluation as a user meets it (issue 58): a progress bar of its windows and probe instances
whose time left counts compute, and the checks that need the data made before W&B starts (a W&B key set and no
server must not delay a refusal)."""

from __future__ import annotations

import math
import time

import pytest

from helpers.runs import FAST, closed_port, compose, run_cli
from pelab.tasks.train import train

NO_BAR = "callbacks.progress_bar=false"


def windows_per_block(n: int, length: int, stride: int | None) -> int:
    """Windows over n scored tokens: nonoverlap ceil(n / L); sliding (stride S < L) the first window, then one per
    S further tokens (the ALiBi paper's protocols)."""
    if stride is None or stride >= length or n <= length:
        return math.ceil(n / length)
    return 1 + math.ceil((n - length) / stride)


def test_the_evaluation_draws_a_bar_of_its_windows_and_instances(tmp_path, capsys):
    """The end of training with a progress bar (callbacks.progress_bar, on by default): one bar per evaluation, the
    count of its windows / probe instances."""
    overrides = [o for o in FAST if o != NO_BAR] + ["logger=csv", "trainer.max_steps=4", "trainer.val_check_interval=4",
                                                    "probes.lengths=[2]"]
    assert train(compose(overrides, tmp_path / "bar"))["status"] == "ok"
    out = capsys.readouterr().out
    # debug=fast: eval.tokens=256 in blocks of the longest length (64) -> 4 blocks of 64; lengths 32, 64 under
    # nonoverlap and sliding (stride: the training length, 32); probes: 2 kinds x 5 depths x 2 samples at 64
    windows = 4 * sum(windows_per_block(64, L, s) for L in (32, 64) for s in (None, 32))
    assert f"extrapolation: 100%|██████████| {windows}/{windows} windows [" in out, out[-2000:]
    assert "probes: 100%|██████████| 20/20 instances [" in out, out[-2000:]


def test_no_bar_outside_an_evaluation_the_suite_shows():
    """An evaluation during training (eval.at, the retrieval metric) or a library call draws nothing: bars are
    opened only inside `showing(True)` (the suite, when the run has a progress bar), one at a time."""
    from pelab.evaluation import progress

    with progress.opened("x", "windows", [(1, 8)], model=None) as bar:
        assert bar is None
    with progress.showing(False), progress.opened("x", "windows", [(1, 8)], model=None) as bar:
        assert bar is None
    with progress.showing(True), progress.opened("x", "windows", [(1, 8)], model=None) as outer:
        assert outer is not None
        with progress.opened("inner", "windows", [(1, 8)], model=None) as inner:
            assert inner is None


def test_the_bars_time_left_counts_compute_not_windows():
    """The windows of 2 x L cost more per token than those of L (attention): after the short ones, the bar stands
    at their share of the FLOPs (PaLM's forward estimate, 2 N + 4 l d T per token at window length T), below
    their share of the windows, so that its time left is not underestimated."""
    from pelab.evaluation import progress
    from pelab.model import build_model

    model = build_model({"n_layers": 2, "n_heads": 2, "d_model": 32}, {"name": "nope"}, vocab_size=64,
                        train_length=512)
    n, layers, d = model.matmul_params(), 2, 32
    bar = progress.Progress("x", "windows", [(16, 512), (8, 1024)], progress.model_flops_per_token(model))
    bar.advance(16, 512)
    per_token = {T: 2 * n + 4 * layers * d * T for T in (512, 1024)}
    share = 16 * 512 * per_token[512] / (16 * 512 * per_token[512] + 8 * 1024 * per_token[1024])
    assert bar.bar.n / bar.bar.total == pytest.approx(share) and share < 16 / 24
    assert bar.count() == "16/24 windows"
    bar.close()


@pytest.mark.slow
def test_a_check_that_needs_the_data_refuses_before_wandb_starts(tmp_path, trained_run):
    """`eval.lengths` longer than the test split, with a W&B key set and no server: refused (train.py and eval.py)
    without starting W&B, which would first wait for the server (logger.wandb.init_timeout, 20 s by default)."""
    env = {"WANDB_API_KEY": "0123456789abcdef" * 2 + "01234567", "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}",
           "PELAB_AVAILABLE_MEMORY": str(1e15)}  # the split's check, not the memory estimate made before the data
    out = tmp_path / "train"
    t0 = time.perf_counter()
    res = run_cli([*FAST, "logger=wandb", "eval.lengths=[4000000]", f"paths.output_dir={out}"], cwd=tmp_path, env=env)
    print(f"train.py refusal with a W&B key and no server: {time.perf_counter() - t0:.1f} s")
    assert res.returncode == 1 and "fewer than one window" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert not (out / "wandb").exists()  # W&B never started
    assert not (out / "checkpoints").exists()

    run, _ = trained_run
    out = tmp_path / "eval"
    res = run_cli([f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "eval.lengths=[4000000]",
                   f"hydra.run.dir={out}"], cwd=tmp_path, env=env, script="eval.py")
    assert res.returncode == 1 and "fewer than one window" in res.stderr.strip().splitlines()[-1], res.stderr[-2000:]
    assert not (out / "wandb").exists()


@pytest.mark.slow
def test_a_step_that_cannot_fit_is_refused_before_the_token_cache_is_built(tmp_path):
    """`data.batch_size=100000` from an empty token cache: the memory estimate runs on the model built on the meta
    device before the cache is built (a BPE cache: ~20 s), so the refusal costs no build."""
    cache = tmp_path / "cache"
    res = run_cli([*FAST, "logger=csv", "data.batch_size=100000", f"paths.output_dir={tmp_path / 'run'}"],
                  cwd=tmp_path, env={"PELAB_CACHE_DIR": str(cache), "PELAB_AVAILABLE_MEMORY": str(8e9)})
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 1 and "data.batch_size=100000" in last and "GB" in last, res.stderr[-2000:]
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))  # no token cache built
