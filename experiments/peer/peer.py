"""The peer: x-transformers trained on PELab's token stream and scored by PELab's own evaluation (issue 20).

    python experiments/peer/peer.py --pe t5_bias [PELab overrides ...]
    python experiments/peer/peer.py --pe rope --out /tmp/peer/rope tokenizer=byte model.d_model=128 \
        model.n_layers=4 model.n_heads=4 data.seq_len=128 data.batch_size=16 trainer.max_steps=1500 \
        optim.warmup_steps=75 data.recall_mix=0 'eval.lengths=[1,2,4,8]' probes.enabled=false

The overrides are composed into PELab's own ``train`` config (real Hydra composition), and everything but
the network comes from it: the DataModule (`build_datamodule`, so batch ``step`` is PELab's batch ``step``
for the same seed), ``trainer.max_steps``, AdamW with ``optim.*`` (weight decay on matrices only, position
parameters never decayed, as `LMModule.configure_optimizers`), `lr_lambda` (warmup + cosine), gradient
clipping at ``optim.grad_clip``, and at the end `pelab.evaluation.suite.run_evaluation` (extrapolation,
non-overlapping and sliding, on the same evaluation tokens as a PELab run of the same config).

The network is x-transformers' ``TransformerWrapper(Decoder)`` of PELab's shape (d_model, layers, heads,
d_ff, tied embeddings, no biases), configured per scheme by ``peer_config`` of
experiments/benchmarks/throughput.py (one place says how a PELab scheme maps onto x-transformers), with
x-transformers' own initialisation and scheme details: its token embedding is kaiming-normal N(0, 2/d), its
tied head scales logits by d^-0.5, its sinusoid is ``ScaledSinusoidalEmbedding`` (learned scale, init
d^-0.5), its learned table is scaled by d^-0.5, its T5 table is N(0, 1) times sqrt(d_head).

Writes ``<out>/summary.json`` in the shape of a PELab run's (``status``, ``config`` with ``pe.name`` =
``xt_<pe>``, ``metrics`` with ``extrap/ppl@L``..., ``evaluation``), so `pelab.report` and
experiments/peer/table.py read both.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("nope", "sinusoidal", "learned", "rope", "alibi", "t5_bias")  # PELab's names of the shared schemes


def _throughput_module() -> Any:
    """experiments/benchmarks/throughput.py (not a package): its ``peer_config`` maps PELab schemes onto
    x-transformers, and its ``import_peer`` says why the peer is missing."""
    spec = importlib.util.spec_from_file_location("pelab_bench_throughput", ROOT / "experiments/benchmarks/throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PeerLM(nn.Module):
    """Any ``net(idx (B, T)) -> logits (B, T, V)`` as PELab's evaluation expects a model: fp32 logits, and
    a length past a learned table raises `PositionOutOfRange` (recorded as n/a, as for PELab's ``learned``)
    instead of x-transformers' assertion."""

    def __init__(self, net: nn.Module, max_position: int | None = None):
        super().__init__()
        self.net = net
        self.max_position = max_position

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        from pelab.encodings.base import PositionOutOfRange

        T = idx.shape[1]
        if self.max_position is not None and T > self.max_position:
            raise PositionOutOfRange(f"learned positions end at {self.max_position - 1} (max_seq_len={self.max_position})")
        return self.net(idx).float()


def compose_config(pe: str, overrides: list[str], out: Path):
    """PELab's train config with the overrides; ``pe=<pe>`` so the config says which scheme this peers."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from pelab import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"pe={pe}", *overrides, f"paths.output_dir={out}"])
    with open_dict(cfg):
        cfg.pe.name = f"xt_{pe}"  # report rows and figure labels: the peer beside PELab's own `pe`
    return cfg


def build_peer(pe: str, cfg: Any, vocab_size: int, tie_scale: float | None = None) -> tuple[PeerLM, dict]:
    """The x-transformers model of PELab's ``model.*`` shape for scheme ``pe``, and its kwargs. ``tie_scale``:
    the tied head's logit scale (x-transformers' ``tie_embedding_scale``; None = its default d^-0.5, 1 = PELab's
    head)."""
    from x_transformers import Decoder, TransformerWrapper

    m = cfg.model
    d, heads = int(m.d_model), int(m.n_heads)
    d_ff = int(m.d_ff) if m.get("d_ff") else 4 * d
    shape = SimpleNamespace(d=d, heads=heads, layers=int(m.n_layers), seq=int(cfg.data.seq_len), vocab=vocab_size)
    layers, wrapper = _throughput_module().peer_config(pe, shape)
    layers.update(ff_mult=d_ff / d, attn_dropout=float(m.dropout), ff_dropout=float(m.dropout))
    if tie_scale is not None:
        wrapper = {**wrapper, "tie_embedding_scale": float(tie_scale)}
    net = TransformerWrapper(attn_layers=Decoder(**layers), **wrapper)
    max_position = shape.seq if pe == "learned" else None
    return PeerLM(net, max_position), {"decoder": layers, "wrapper": wrapper}


def optimizer_and_schedule(model: nn.Module, optim: Any, total_steps: int):
    """AdamW + LambdaLR exactly as `LMModule.configure_optimizers`: decay on matrices that are not position
    parameters (x-transformers' ``pos_emb.*`` tables and ``rel_pos.*`` T5 table), none on the rest."""
    from pelab.training.optimizer import lr_lambda

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        position = ".pos_emb." in f".{name}" or ".rel_pos." in f".{name}"
        (decay if p.dim() >= 2 and not position else no_decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": float(optim.weight_decay)}, {"params": no_decay, "weight_decay": 0.0}],
        lr=float(optim.lr), betas=tuple(optim.betas), eps=float(optim.eps),
    )
    warmup, min_ratio = int(optim.warmup_steps), float(optim.min_lr_ratio)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, warmup, total_steps, min_ratio))
    return opt, sched


def val_loss(model: nn.Module, datamodule: Any) -> float:
    """Mean NLL over PELab's validation windows (its `val/loss`)."""
    nll, n = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            logits = model(batch[:, :-1])  # (B, T, V)
            nll += float(nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"))
            n += batch[:, 1:].numel()
    model.train()
    return nll / max(n, 1)


def evaluate(model: nn.Module, datamodule: Any, cfg: Any, out: Path, summary: dict | None = None) -> dict[str, float]:
    """PELab's end-of-training evaluation, unchanged (`run_evaluation`: same function, same tokens)."""
    from pelab.evaluation.suite import run_evaluation

    return run_evaluation(model, datamodule, cfg, out, run=None, summary=summary)


def unscale_position_table(model: PeerLM) -> None:
    """x-transformers' learned table is ``emb(pos) * d^-0.5`` with ``emb`` ~ N(0, 1): the same function as an
    unscaled table ~ N(0, d^-1), but under Adam (steps of about lr in parameter units) it moves d^-0.5 times
    as fast in output units. Fold the scale into the table, so only that learning rate changes (an
    experiment on the peer's learned-position gap, experiments/peer/README.md)."""
    pos = model.net.pos_emb
    with torch.no_grad():
        pos.emb.weight.mul_(pos.scale)
    pos.scale = 1.0


def init_t5_table(model: PeerLM, std: float) -> None:
    """Re-draw x-transformers' T5 table (``rel_pos.relative_attention_bias``, N(0, 1) by default, used × sqrt(d_head))
    from N(0, std): with std = d_model^-0.5 it starts as PELab's table does (an experiment on the peer's T5
    seed that trains badly, experiments/peer/README.md)."""
    with torch.no_grad():
        model.net.attn_layers.rel_pos.relative_attention_bias.weight.normal_(0.0, std)


def train(pe: str, overrides: list[str], out: Path, log_every: int = 100, unscaled_table: bool = False,
          t5_table_std: float | None = None, tie_scale: float | None = None) -> dict:
    """Train the peer of ``pe`` under PELab's config ``overrides``; write and return its summary."""
    import importlib.metadata

    from omegaconf import OmegaConf

    from pelab.runs.build import build_datamodule, data_record
    from pelab.summary import versions, write_summary

    t0 = time.time()
    cfg = compose_config(pe, overrides, out)
    steps = int(cfg.trainer.max_steps)
    datamodule = build_datamodule(cfg, int(cfg.data.batch_size))
    datamodule.prepare_data()
    datamodule.setup("fit")
    torch.manual_seed(int(cfg.seed))
    model, kwargs = build_peer(pe, cfg, datamodule.vocab_size, tie_scale)
    if unscaled_table:
        unscale_position_table(model)
    if t5_table_std is not None:
        init_t5_table(model, t5_table_std)
    opt, sched = optimizer_and_schedule(model, cfg.optim, steps)
    clip = float(cfg.optim.get("grad_clip") or 0.0)
    stream = datamodule.train_dataset(start_step=0, rank=0)  # PELab's batch `step` for this seed
    curve: list[dict] = []
    model.train()
    for step in range(steps):
        batch = stream.batch(step)
        x, y = batch.inputs, batch.targets  # (B, T) each, PELab's targets
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        value = loss.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite loss at step {step}")
        if step % log_every == 0 or step == steps - 1:
            curve.append({"step": step, "loss": value, "lr": opt.param_groups[0]["lr"]})
            print(f"step {step:5d}  loss {value:.4f}", flush=True)
    vl = val_loss(model, datamodule)
    summary: dict[str, Any] = {
        "status": "ok",
        "output_dir": str(out),
        "command": " ".join(["experiments/peer/peer.py", "--pe", pe, *(["--unscaled-table"] if unscaled_table else []),
                             *([f"--t5-table-std={t5_table_std}"] if t5_table_std is not None else []),
                             *([f"--tie-scale={tie_scale}"] if tie_scale is not None else []), *overrides]),
        # PELab's config minus its encoding's knobs (e.g. pe.bias_scale), which the peer's scheme does not read
        "config": {**OmegaConf.to_container(cfg, resolve=True),
                   "pe": {"name": cfg.pe.name, **({"unscaled_table": True} if unscaled_table else {}),
                          **({"t5_table_std": t5_table_std} if t5_table_std is not None else {}),
                          **({"tie_scale": tie_scale} if tie_scale is not None else {})}},
        "peer": {"library": "x-transformers", "version": importlib.metadata.version("x-transformers"),
                 "scheme": pe, "kwargs": kwargs},
        "data": data_record(datamodule),  # PELab's tokens: reports check both sides saw the same ones
        "model": {"params": sum(p.numel() for p in model.parameters())},
        "versions": versions(),
        "global_step": steps,
        "train_curve": curve,
    }
    metrics = {"val/loss": vl, "val/ppl": math.exp(min(vl, 80.0)), "train/loss": curve[-1]["loss"]}
    metrics.update(evaluate(model, datamodule, cfg, out, summary))
    summary["metrics"] = metrics
    summary["wall_seconds"] = round(time.time() - t0, 2)
    write_summary(out, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pe", required=True, choices=SCHEMES, help="the PELab scheme to peer")
    p.add_argument("--out", type=Path, default=None, help="output folder (default outputs/peer/<pe>_s<seed>)")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--unscaled-table", action="store_true",
                   help="learned only: fold x-transformers' d^-0.5 into its position table (same function at "
                        "step 0, d^0.5 times its learning rate in output units)")
    p.add_argument("--t5-table-std", type=float, default=None,
                   help="t5_bias only: draw x-transformers' T5 table from N(0, STD) instead of N(0, 1) "
                        "(d_model^-0.5 = PELab's init)")
    p.add_argument("--tie-scale", type=float, default=None,
                   help="the tied head's logit scale (x-transformers' tie_embedding_scale, default d^-0.5; "
                        "1 = PELab's head)")
    p.add_argument("overrides", nargs="*", help="PELab config overrides (train.yaml), e.g. seed=1 data.seq_len=128")
    a = p.parse_args(argv)
    if importlib.util.find_spec("x_transformers") is None:
        print("x-transformers is not installed; install the bench extra: pip install -e .[bench]", file=sys.stderr)
        return 2
    seed = next((o.split("=", 1)[1] for o in a.overrides if o.startswith("seed=")), "0")
    out = a.out or ROOT / "outputs" / "peer" / f"{a.pe}_s{seed}"
    if a.unscaled_table and a.pe != "learned":
        p.error("--unscaled-table applies to --pe learned only (the other schemes have no scaled table)")
    if a.t5_table_std is not None and (a.pe != "t5_bias" or a.t5_table_std <= 0):
        p.error("--t5-table-std applies to --pe t5_bias only and must be > 0")
    if a.tie_scale is not None and a.tie_scale <= 0:
        p.error("--tie-scale must be > 0")
    summary = train(a.pe, list(a.overrides), Path(out).resolve(), a.log_every, a.unscaled_table, a.t5_table_std,
                    a.tie_scale)
    m = summary["metrics"]
    lengths = summary["evaluation"]["extrapolation"]["lengths"]
    print("ppl " + "  ".join(f"{L}: {m.get(f'extrap/ppl@{L}', float('nan')):.3f}" for L in lengths))
    print(f"summary: {Path(out) / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
