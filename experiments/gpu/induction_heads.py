"""Mamba's Table 11 (the three attention rows) at the paper's step counts on one GPU: the GPU plan of issue 51.

Each row's seeds are one stacked model (torch.func.stack_module_state + functional_call + vmap: the ensembling
recipe of the torch.func docs), trained by one AdamW over the stacked tensors, which is each seed's own AdamW
(elementwise, weight decay 0); the loss is the sum of the seeds' losses, so each seed's gradient is its own. On CUDA
the whole step (forward, backward, optimizer) is one captured CUDA graph (PyTorch's "whole network capture"): a
step of this 137K-parameter model is kernel-launch bound, and Lightning's per-step overhead alone would make one
409,600-step run longer than a 15-minute GPU session. The recipe is the study's, composed from
conf/experiment/induction_heads.yaml (the run config each row's CPU runs record), and each seed sees the batch stream
of its CPU run (`InductionStream`: batch t = f(seed, t)), step for step: tests/test_induction_gpu.py checks that a
few stacked steps give each seed the weights `train()` under Lightning gives it.

    python experiments/gpu/induction_heads.py --probe --out outputs/gpu/induction_heads    # <= 1 min: rate, plan
    python experiments/gpu/induction_heads.py --out outputs/gpu/induction_heads --minutes 9  # train; relaunch continues
    python experiments/gpu/induction_heads.py --cpu-smoke --out /tmp/ih_smoke              # the machinery, tiny, on CPU
    python experiments/gpu/induction_heads.py --rows schemes --probe --out outputs/gpu/induction_schemes  # issue 52's rows
    python experiments/induction_heads/compare.py outputs/gpu/induction_heads/runs            # the paper's table

Along training, every `--check-every` steps (500, the study's) the in-window check (256 fixed instances at 2^8) and
every `--curve-every` (2,500) the curve at 2^9-2^11 (callbacks.induction_curve's instances and scorer); at the end of
a row the final evaluation of the CPU runs (`run_probes`: 500 instances per length to 2^12, 256 at 2^13-2^14, the
same instances). Each seed gets a folder <out>/runs/<row>-s<seed>/ with summary.json and csv/metrics.csv in the
shape compare.py reads, so the paper comparison and its plateau criterion are the CPU study's. The state
(<out>/state/<row>.pt: stacked weights, optimizer, step, the curve) is saved every --save-every steps and when
--minutes runs out; a relaunch continues it exactly (the data is a function of the step).

The stacked step runs SDPA's math form (plain ops that vmap batches; the fused CPU kernel has no batching rule and no
gradient for a learned bias under vmap), so every scheme trains stacked: issue 52's rows (`--rows schemes`: NoPE,
learned, T5, ALiBi, KERPLE log / power, Sandwich, FIRE, CoPE, p-RoPE, randomized positions) as the paper's three;
tests/test_induction_gpu.py checks each seed's loss and gradient against its own model. The evaluation runs each
seed's own GPT with the CPU runs' kernels.

Status: unrun on a GPU (none lent so far); the CPU smoke and the Lightning equivalence run in the tests.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.func import functional_call, stack_module_state, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

import pelab.training.config  # noqa: F401 - stores the schemas (pe/_RoPEConfig, ...) that the composition uses
from pelab import CONF_DIR
from pelab.data.recall.induction import INDUCTION_HEADS, InductionVocabulary
from pelab.data.recall.induction_data import InductionCurve, InductionStream
from pelab.evaluation.probes import run_probes
from pelab.metric_keys import metric_key
from pelab.model import build_model
from pelab.provenance import code_version

# each row's overrides of experiment=induction_heads: the paper's three (as experiments/induction_heads/run.sh), then
# issue 52's every scheme (experiments/induction_schemes), trained for the paper's rotary count unless the paper says;
# the learned table holds the 257 positions a training row reaches (2^8 + 1): past them its cells are n/a
PAPER_ROWS = {"sinusoidal": ["pe=sinusoidal", "pe.scale=0.125"], "rope": ["pe=rope"], "xpos": ["pe=xpos"]}
SCHEME_ROWS = {"nope": ["pe=nope"], "learned": ["pe=learned", "pe.max_position=257"], "t5_bias": ["pe=t5_bias"], "alibi": ["pe=alibi"],
               "kerple_log": ["pe=kerple", "pe.variant=log"], "kerple_power": ["pe=kerple", "pe.variant=power"],
               "sandwich": ["pe=sandwich"], "fire": ["pe=fire"], "cope": ["pe=cope"],
               "p_rope": ["pe=rope", "pe.frequency_fraction=0.75"],
               "randomized": ["pe=rope", "pe.randomized.max_position=16384"]}
ROWS = {**PAPER_ROWS, **SCHEME_ROWS}
PAPER_STEPS = {"sinusoidal": 204_800, "rope": 409_600, "xpos": 409_600}
STEPS = 409_600  # a row the paper does not have
RECORDED = ("model", "pe", "data", "optim", "probes", "trainer")
SMOKE = ["data.seq_len=16", "model.d_model=16", "model.n_heads=2", "probes.lengths=[0.5,1,2]", "probes.samples=6",
         "data.long_probe_samples=4", "data.long_probe_from=32"]


def compose_row(row: str, overrides: list[str] = ()) -> DictConfig:
    """The run config of one row, as `python train.py experiment=induction_heads <row> <overrides>` composes it."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=["experiment=induction_heads", *ROWS[row], *overrides])


@dataclass
class Stacked:
    """The seeds of one row as one model: ``params`` / ``buffers`` {name: (S, ...)}, ``base`` the module whose
    forward runs on them (on the meta device: no weights of its own), ``opt`` AdamW over the stacked tensors."""

    cfg: DictConfig
    seeds: list[int]
    base: torch.nn.Module
    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    opt: torch.optim.Optimizer

    @classmethod
    def build(cls, cfg: DictConfig, seeds: list[int], device: torch.device) -> Stacked:
        o = cfg.optim
        if float(o.weight_decay) != 0.0 or float(o.warmup_steps) != 0 or float(o.min_lr_ratio) != 1.0:
            raise SystemExit("optim: the stacked trainer runs the paper's constant-rate Adam only (weight_decay=0, "
                             "warmup_steps=0, min_lr_ratio=1); got "
                             f"{o.weight_decay}, {o.warmup_steps}, {o.min_lr_ratio}")
        if float(o.grad_clip or 0.0) != 0.0 or cfg.data.targets != "answer":
            raise SystemExit("optim.grad_clip must be 0 and data.targets=answer (the study's recipe)")
        models = []
        for s in seeds:  # the init of each seed's CPU run: train() seeds torch with seed_everything(seed)
            torch.manual_seed(int(s))
            models.append(build_model(cfg.model, cfg.pe, InductionVocabulary.vocab_size, int(cfg.data.seq_len)))
        params, buffers = stack_module_state(models)  # (S, ...) leaves that require grad
        params = {k: v.to(device).detach().requires_grad_() for k, v in params.items()}
        buffers = {k: v.to(device) for k, v in buffers.items()}
        cuda = device.type == "cuda"
        opt = torch.optim.AdamW(list(params.values()), lr=float(o.lr), betas=tuple(o.betas), eps=float(o.eps),
                                weight_decay=0.0, capturable=cuda, foreach=True)
        with torch.device("meta"):  # built, not moved: .to("meta") would untie a tied head from the embedding
            base = build_model(cfg.model, cfg.pe, InductionVocabulary.vocab_size, int(cfg.data.seq_len))
        return cls(cfg, [int(s) for s in seeds], base, params, buffers, opt)

    def losses(self, rows: torch.Tensor) -> torch.Tensor:
        """rows (S, B, L + 2) -> (S,) each seed's loss: the answer's cross-entropy at the query, as the CPU runs'
        data.targets=answer (the other positions are fed, not scored)."""
        x, answer = rows[..., :-1], rows[..., -1]  # (S, B, L + 1), (S, B)

        def logits(p: dict, b: dict, x1: torch.Tensor) -> torch.Tensor:  # one seed: (B, L + 1) -> (B, L + 1, V)
            return functional_call(self.base, (p, b), (x1,))

        # SDPA's math form: plain ops that vmap batches (the fused CPU kernel has no batching rule and no gradient
        # for a learned bias under vmap); at T = 257 and 137K parameters its cost is the kernels' count, not size
        with sdpa_kernel(SDPBackend.MATH):
            # randomness "different": a randomized-positions row draws each seed's own positions (not the CPU
            # run's draws, which seed torch per step: the same distribution)
            z = vmap(logits, randomness="different")(self.params, self.buffers, x)[:, :, -1]  # (S, B, V): the query's
        return F.cross_entropy(z.flatten(0, 1).float(), answer.flatten(), reduction="none").view(answer.shape).mean(1)

    def step(self, rows: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=False)
        loss = self.losses(rows)
        loss.sum().backward()
        self.opt.step()
        return loss.detach()

    def load_into(self, model: torch.nn.Module, i: int) -> torch.nn.Module:
        """Seed i's weights in a plain GPT (for the scorers of the CPU runs)."""
        # the non-persistent buffers (RoPE's inv_freq) are not state; a tied head is the embedding's one tensor
        stacked = {**self.params, **self.buffers}
        missing = model.load_state_dict({k: stacked[k][i].detach() for k in model.state_dict() if k in stacked},
                                        strict=False).missing_keys
        tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
        if set(missing) - tied:
            raise RuntimeError(f"stacked weights lack {sorted(set(missing) - tied)}")
        return model

    def state(self) -> dict:
        return {"params": {k: v.detach().cpu() for k, v in self.params.items()}, "opt": self.opt.state_dict()}

    def restore(self, state: dict) -> None:
        with torch.no_grad():
            for k, v in self.params.items():
                v.copy_(state["params"][k])
        self.opt.load_state_dict(state["opt"])


# -- data: each seed's CPU-run stream, in chunks of K steps ------------------------------------------------------
class Chunks(torch.utils.data.Dataset):
    """Chunk c: (K, S, B, L + 2) int64, the rows of steps cK ... cK + K - 1 of every seed's stream (`InductionStream`
    of its CPU run: rank 0, data.targets=answer), drawn in DataLoader workers while the GPU trains."""

    def __init__(self, cfg: DictConfig, seeds: list[int], K: int):
        L, B = int(cfg.data.seq_len), int(cfg.data.batch_size)
        self.streams = [InductionStream(L, B, s, targets="answer") for s in seeds]
        self.K = int(K)

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, c: int) -> torch.Tensor:
        return torch.stack([torch.stack([st.batch(t).tokens for st in self.streams])
                            for t in range(c * self.K, (c + 1) * self.K)])


def chunk_loader(cfg: DictConfig, seeds: list[int], K: int, first: int, workers: int, pin: bool):
    ds = Chunks(cfg, seeds, K)
    return iter(torch.utils.data.DataLoader(ds, batch_size=None, sampler=range(first, 1 << 40), num_workers=workers,
                                            pin_memory=pin, prefetch_factor=4 if workers else None))


# -- the step: eager, or one CUDA graph ----------------------------------------------------------------------
def graphed(stacked: Stacked, example: torch.Tensor):
    """stacked.step as one captured CUDA graph: returns step(rows) -> (S,) losses. The warm-up steps that capture
    needs (on a side stream, as PyTorch's whole-network-capture recipe) are undone: the weights and the optimizer's
    state are put back, so the graph's first replay is the run's next step."""
    weights = {k: v.detach().clone() for k, v in stacked.params.items()}
    moments = {p: ({k: v.clone() for k, v in stacked.opt.state[p].items()} if p in stacked.opt.state else None)
               for p in stacked.params.values()}
    static = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            stacked.opt.zero_grad(set_to_none=True)
            stacked.losses(static).sum().backward()
            stacked.opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    stacked.opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss = stacked.losses(static)
        loss.sum().backward()
        stacked.opt.step()
    with torch.no_grad():
        for k, v in stacked.params.items():
            v.copy_(weights[k])
        for p, before in moments.items():
            for k, v in stacked.opt.state[p].items():
                v.copy_(before[k]) if before is not None else v.zero_()

    def step(rows: torch.Tensor) -> torch.Tensor:
        static.copy_(rows, non_blocking=True)
        graph.replay()
        return loss

    return step


def eager(stacked: Stacked, example: torch.Tensor):
    return stacked.step


# -- along training and at the end ----------------------------------------------------------------------------
class Checks:
    """The CPU runs' along-training measurements for each seed: the in-window check (callbacks.retrieval_criterion:
    its samples and seed, at the training length; the same instances) and the curve (callbacks.induction_curve)."""

    def __init__(self, cfg: DictConfig, device: torch.device):
        rc, ic = cfg.callbacks.retrieval_criterion, cfg.callbacks.induction_curve
        self.in_window = InductionCurve([int(cfg.data.seq_len)], int(rc.samples), seed=int(rc.seed))
        self.curve = InductionCurve(list(ic.lengths), int(ic.samples), seed=int(ic.seed))
        for c in (self.in_window, self.curve):
            c.setup(None, None, "fit")
        self.model = build_model(cfg.model, cfg.pe, InductionVocabulary.vocab_size, int(cfg.data.seq_len)).to(device)

    def measure(self, stacked: Stacked, curve: bool) -> list[dict[str, float]]:
        out = []
        for i in range(len(stacked.seeds)):
            m = stacked.load_into(self.model, i)
            row = {"train/retrieval_acc": self.in_window.accuracy(m, self.in_window.lengths[0])}
            if curve:
                row.update({metric_key("train/induction_acc", n): self.curve.accuracy(m, n) for n in self.curve.lengths})
            out.append(row)
        return out


def final_evaluation(cfg: DictConfig, model: torch.nn.Module, device: torch.device, samples: int | None = None,
                     lengths: list[int] | None = None) -> list[dict]:
    """The CPU runs' final probe evaluation (run_probes on probes.* with the run's vocabulary and its cap at the long
    lengths): one row per length, n, accuracy and its Wilson interval."""
    p, L = cfg.probes, int(cfg.data.seq_len)
    vocab = InductionVocabulary(cfg.data.long_probe_samples, int(cfg.data.long_probe_from))
    lengths = lengths or [round(m * L) for m in p.lengths]
    res = run_probes(model, vocab, kinds=[INDUCTION_HEADS], depths=list(p.depths), lengths=lengths,
                     samples_per_cell=int(samples or p.samples), seed=int(p.seed), device=device)
    return [{"length": c.length, "n": c.n, "acc": c.acc, "lo": c.lo, "hi": c.hi} for c in res.cells.values()]


def write_folders(out: Path, row: str, stacked: Stacked, history: list[dict], finals: list[list[dict]],
                  extra: dict) -> list[Path]:
    """<out>/runs/<row>-s<seed>/{summary.json, csv/metrics.csv}: what compare.py reads of a CPU run."""
    folders = []
    keys = sorted({k for h in history for k in h["seeds"][0]})
    for i, seed in enumerate(stacked.seeds):
        cfg = copy.deepcopy(stacked.cfg)
        cfg.seed = seed
        folder = out / "runs" / f"{row}-s{seed}"
        (folder / "csv").mkdir(parents=True, exist_ok=True)
        with open(folder / "csv" / "metrics.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["step", *keys])
            w.writeheader()
            for h in history:  # Lightning's rows name the step before the measurement's
                w.writerow({"step": h["step"] - 1, **h["seeds"][i]})
        metrics = {metric_key("probe/induction_heads/acc", r["length"]): r["acc"] for r in finals[i]}
        summary = {"status": "ok", "name": f"{row}-induction-L{cfg.data.seq_len}-s{seed}", **extra,
                   # the keys that make the run (the rest are the CPU runner's paths, loggers and callbacks)
                   "config": {"seed": seed, **{k: OmegaConf.to_container(cfg[k], resolve=True) for k in RECORDED}},
                   "global_step": history[-1]["step"],
                   "metrics": {**metrics, **history[-1]["seeds"][i]},
                   "evaluation": {"probes": {"rows": finals[i]}}}
        (folder / "summary.json").write_text(json.dumps(summary, indent=1))
        folders.append(folder)
    return folders


# -- one row, resumable ---------------------------------------------------------------------------------------
@dataclass
class Settings:
    out: Path
    device: torch.device
    seeds: list[int]
    rows: list[str]
    steps: dict[str, int]  # per row
    overrides: list[str]
    chunk: int = 500
    check_every: int = 500
    curve_every: int = 2500
    save_every: int = 10_000
    workers: int = 2
    graphs: bool = True
    deadline: float = math.inf  # time.monotonic() by which a call saves and returns
    final_seconds: float = 60.0  # kept free for a row's final evaluation (the probe measures it)
    max_chunks: int | None = None  # this call trains at most this many chunks (a row split over calls; the tests)


def check(s: Settings) -> None:
    """One line naming the setting and the fix, before any training."""
    for name in ("check_every", "curve_every", "save_every"):
        if getattr(s, name) % s.chunk:
            raise SystemExit(f"--{name.replace('_', '-')}={getattr(s, name)} must be a multiple of --chunk={s.chunk} "
                             "(the steps run in chunks)")
    for row, n in s.steps.items():
        if n % s.curve_every:
            raise SystemExit(f"{row}: {n} steps must be a multiple of --curve-every={s.curve_every} (the plateau "
                             "criterion reads the curve at the last step)")
    if s.graphs and s.device.type != "cuda":
        raise SystemExit("CUDA graphs need a CUDA device: add --no-graphs to run the step eagerly")


def run_row(s: Settings, row: str) -> dict:
    """Trains (or continues) one row to s.steps[row] or until s.deadline; at the end its final evaluation and folders.
    Returns {"row", "step", "done", "seconds"}."""
    t0 = time.monotonic()
    state_path = s.out / "state" / f"{row}.pt"
    cfg = compose_row(row, s.overrides)
    stacked = Stacked.build(cfg, s.seeds, s.device)
    step, history = 0, []
    if state_path.exists():
        saved = torch.load(state_path, map_location=s.device, weights_only=False)
        if saved["seeds"] != s.seeds or saved["overrides"] != s.overrides:
            raise SystemExit(f"{state_path} holds seeds {saved['seeds']} / overrides {saved['overrides']}: relaunch with "
                             "those, or another --out")
        stacked.restore(saved)
        step, history = int(saved["step"]), saved["history"]
        if saved.get("done"):
            return {"row": row, "step": step, "done": True, "seconds": 0.0}
    total = s.steps[row]
    checks = Checks(cfg, s.device)

    def save(done: bool = False) -> None:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = state_path.with_suffix(".tmp")
        torch.save({**stacked.state(), "step": step, "history": history, "seeds": s.seeds,
                    "overrides": s.overrides, "done": done}, tmp)
        os.replace(tmp, state_path)  # a kill mid-save keeps the last state

    chunks = chunk_loader(cfg, s.seeds, s.chunk, step // s.chunk, s.workers, s.device.type == "cuda")
    run_step = None
    per_chunk, trained = 0.0, 0
    while step < total:
        last = step + s.chunk >= total
        if (time.monotonic() + 2 * per_chunk + (s.final_seconds if last else 0.0) > s.deadline
                or trained == s.max_chunks):
            save()
            return {"row": row, "step": step, "done": False, "seconds": time.monotonic() - t0}
        tc = time.monotonic()
        rows = next(chunks).to(s.device, non_blocking=True)  # (K, S, B, L + 2)
        if run_step is None:
            run_step = (graphed if s.graphs else eager)(stacked, rows[0])
        loss = torch.zeros(len(s.seeds), device=s.device)
        for k in range(s.chunk):
            loss += run_step(rows[k])
        step, trained = step + s.chunk, trained + 1
        if step % s.check_every == 0:
            measured = checks.measure(stacked, curve=step % s.curve_every == 0)
            mean_loss = (loss / s.chunk).tolist()
            history.append({"step": step, "seeds": [{**m, "train/loss": mean_loss[i]} for i, m in enumerate(measured)]})
        if step % s.save_every == 0:
            save()
        per_chunk = time.monotonic() - tc
    finals = [final_evaluation(cfg, stacked.load_into(checks.model, i), s.device) for i in range(len(s.seeds))]
    extra = {"runner": "experiments/gpu/induction_heads.py", "provenance": {"code": code_version()},
             "device": torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else "cpu",
             "step_mode": "cuda graph" if s.graphs else "eager", "stacked_seeds": s.seeds}
    write_folders(s.out, row, stacked, history, finals, extra)
    save(done=True)
    return {"row": row, "step": step, "done": True, "seconds": time.monotonic() - t0}


def run(s: Settings) -> list[dict]:
    """Every row in turn (each resumable), until s.deadline."""
    check(s)
    s.out.mkdir(parents=True, exist_ok=True)
    done = []
    for row in s.rows:
        r = run_row(s, row)
        done.append(r)
        print(json.dumps(r), flush=True)
        if not r["done"]:
            break
    return done


# -- the probe (<= 1 minute) and the plan ---------------------------------------------------------------------
def probe(s: Settings, seconds_per_row: float = 15.0) -> dict:
    """Measures, per row with every seed stacked: steps per second (after the graph's capture), one along-training
    measurement (in-window + curve), and the final evaluation of one seed at each length on a few instances, scaled
    to its counts. Returns the plan: the minutes each row needs for its paper steps, and the calls of --minutes."""
    check(s)
    plan = {"device": torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else "cpu",
            "step_mode": "cuda graph" if s.graphs else "eager", "seeds": s.seeds, "rows": {}}
    for row in s.rows:
        cfg = compose_row(row, s.overrides)
        stacked = Stacked.build(cfg, s.seeds, s.device)
        chunks = chunk_loader(cfg, s.seeds, s.chunk, 0, s.workers, s.device.type == "cuda")
        rows = next(chunks).to(s.device)
        step = (graphed if s.graphs else eager)(stacked, rows[0])
        step(rows[0])  # the first replay / eager step pays one-off costs
        sync = torch.cuda.synchronize if s.device.type == "cuda" else (lambda: None)
        sync()
        t, n = time.monotonic(), 0
        while n < s.chunk and time.monotonic() - t < seconds_per_row / 2:
            step(rows[n])
            n += 1
            if n % 50 == 0:
                sync()
        sync()
        rate = n / (time.monotonic() - t)
        checks = Checks(cfg, s.device)
        t = time.monotonic()
        checks.measure(stacked, curve=True)
        measure_s = time.monotonic() - t
        model = stacked.load_into(checks.model, 0)
        L, few = int(cfg.data.seq_len), 16
        vocab = InductionVocabulary(cfg.data.long_probe_samples, int(cfg.data.long_probe_from))
        final_s = 0.0
        for length in [round(m * L) for m in cfg.probes.lengths]:
            t = time.monotonic()
            final_evaluation(cfg, model, s.device, samples=few, lengths=[length])
            final_s += (time.monotonic() - t) * vocab.probe_samples(length, int(cfg.probes.samples)) / few
        steps = s.steps[row]
        train_min = steps / rate / 60
        checks_min = steps / s.check_every * measure_s / 60  # every check measured as a curve point: an upper bound
        final_min = final_s * len(s.seeds) / 60
        plan["rows"][row] = {"steps": steps, "steps_per_s": round(rate, 1), "measure_s": round(measure_s, 3),
                             "final_s_per_seed": round(final_s, 1), "train_min": round(train_min, 1),
                             "checks_min": round(checks_min, 1), "final_min": round(final_min, 1),
                             "total_min": round(train_min + checks_min + final_min, 1)}
        del stacked, chunks
    plan["total_min"] = round(sum(r["total_min"] for r in plan["rows"].values()), 1)
    return plan


def parse(argv: list[str] | None = None) -> tuple[Settings, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="state, plan.json and runs/ (compare.py reads runs/)")
    ap.add_argument("--rows", nargs="+", default=list(PAPER_ROWS), choices=[*ROWS, "schemes"],
                    help="the paper's three (default), named rows, or 'schemes': issue 52's every scheme")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=None, help="every row's steps (default: the paper's per row)")
    ap.add_argument("--minutes", type=float, default=9.0, help="this call's time: it saves and returns before")
    ap.add_argument("--probe", action="store_true", help="measure for <= 1 minute and write <out>/plan.json")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes and steps on the CPU, eager")
    ap.add_argument("--no-graphs", action="store_true", help="the step eagerly (no CUDA graph)")
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--check-every", type=int, default=500)
    ap.add_argument("--curve-every", type=int, default=2500)
    ap.add_argument("--save-every", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers drawing the batches")
    ap.add_argument("--max-chunks", type=int, default=None, help="train at most this many chunks in this call")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of experiment=induction_heads (key=value)")
    a = ap.parse_args(argv)
    overrides, device, graphs = list(a.overrides), torch.device("cuda" if torch.cuda.is_available() else "cpu"), True
    if a.cpu_smoke:
        device, graphs, a.workers = torch.device("cpu"), False, 0
        overrides = [*SMOKE, "callbacks.retrieval_criterion.samples=8", "callbacks.induction_curve.lengths=[32]",
                     "callbacks.induction_curve.samples=4", *overrides]
        a.steps = a.steps or 6
        a.chunk = a.check_every = a.curve_every = a.save_every = 3
        a.seeds = a.seeds if a.seeds != [0, 1, 2, 3, 4] else [0, 1]
    a.rows = [r for name in a.rows for r in (SCHEME_ROWS if name == "schemes" else [name])]
    steps = {r: int(a.steps) if a.steps else PAPER_STEPS.get(r, STEPS) for r in a.rows}
    s = Settings(a.out, device, a.seeds, a.rows, steps, overrides, a.chunk, a.check_every, a.curve_every,
                 a.save_every, a.workers, graphs and not a.no_graphs, time.monotonic() + 60 * a.minutes,
                 max_chunks=a.max_chunks)
    return s, a


def main(argv: list[str] | None = None) -> int:
    s, a = parse(argv)
    plan_path = s.out / "plan.json"
    if a.probe:
        plan = probe(s)
        s.out.mkdir(parents=True, exist_ok=True)
        plan_path.write_text(json.dumps(plan, indent=1))
        for row, r in plan["rows"].items():
            print(f"{row:10s} {r['steps']:>7d} steps at {r['steps_per_s']:>7.1f}/s ({len(s.seeds)} seeds stacked): "
                  f"train {r['train_min']} min + checks {r['checks_min']} + final evaluation {r['final_min']} = "
                  f"{r['total_min']} min")
        print(f"all rows: {plan['total_min']} min on {plan['device']} ({plan['step_mode']}); calls of --minutes "
              f"{a.minutes:g}: {math.ceil(plan['total_min'] / max(a.minutes - 1, 1))} (each continues the last)")
        return 0
    if plan_path.exists():  # the final evaluation's time, measured by the probe
        rows = json.loads(plan_path.read_text())["rows"]
        s.final_seconds = max([1.2 * r["final_min"] * 60 for r in rows.values()] + [s.final_seconds])
    done = run(s)
    return 0 if all(r["done"] for r in done) and len(done) == len(s.rows) else 3


if __name__ == "__main__":
    raise SystemExit(main())
