"""Why a row fails beyond 2^8 (issue 52, "Why"; issue 51's rows too): attention of each run's last checkpoint on probe
instances of the induction-heads task at 2^8 and 2^11 tokens (the probes' instances, the same in every run):

* the attention diagnostics (`pelab.evaluation.attention_stats`): per layer, averaged over heads, at the queries of
  the last position bucket (the positions first reached at that length): entropy in nats, mean attention distance in
  tokens, mass at distances the training rows never had (>= 257);
* the answer's read-out: at the query (the last input), in the last layer, the head that puts the most attention on
  the answer's copy in the context (the token after the first trigger), with that mass (``copy``), its entropy and its
  mass at distances >= 257 (``far``): an induction head reads the copy; a row that fails beyond 2^8 either stops
  finding it or spreads over the longer context.

Associations across rows and seeds, not causes. One forward per instance.

    python experiments/induction_schemes/attention.py <sweep folder>... [--instances 16] [--out attention.md]
    python experiments/induction_schemes/attention.py --records attention.json --out attention.md   # re-render only
    python experiments/induction_schemes/attention.py <sweep folder>... --records earlier.json... --out attention.md
        (the runs already in the records are not read again: issue 51's records, or a study's first seeds)
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

from pelab.data.recall import make_probe_samples
from pelab.data.recall.induction import INDUCTION_HEADS, VOCABULARY
from pelab.evaluation.attention_stats import attention_diagnostics, metrics
from pelab.metric_keys import metric_key
from pelab.model import build_model
from pelab.training.checkpoints import load_run_checkpoint, model_state

LENGTHS = (256, 2048)  # task lengths: the model reads L + 1 tokens
STATS = ("entropy", "distance", "mass_past_L")
SEED = 1234  # probes.seed of experiment=induction_heads: the final evaluation's instances


class QueryReadout:
    """Observer of the last layer (``CausalSelfAttention.observer``): the last query's attention per head, (H, K)."""

    def __init__(self) -> None:
        self.probs: torch.Tensor | None = None

    def __call__(self, scores: torch.Tensor, q0: int) -> None:  # scores (1, H, C, K), queries q0 .. q0 + C - 1
        if q0 + scores.shape[-2] == scores.shape[-1]:  # the chunk that holds the last query
            self.probs = scores[0, :, -1].float().softmax(-1)  # (H, K)


def readout(model: torch.nn.Module, samples: list, train_rows: int) -> dict[str, float]:
    """Means over instances of the last layer's copy-reading head at the query: copy mass, entropy, far mass."""
    copy, entropy, far = [], [], []
    last = model.blocks[-1].attn
    with torch.no_grad():
        for s in samples:
            rec = QueryReadout()
            last.observer = rec
            try:
                model(torch.tensor([s.input_ids]))
            finally:
                last.observer = None
            p = rec.probs  # (H, K), K = L + 1 keys
            head = int(p[:, s.gold_index].argmax())
            dist = (p.shape[-1] - 1) - torch.arange(p.shape[-1])
            copy.append(float(p[head, s.gold_index]))
            entropy.append(float(-(p[head] * p[head].clamp_min(1e-30).log()).sum()))
            far.append(float(p[head, dist >= train_rows].sum()))
    return {"copy": float(np.mean(copy)), "entropy": float(np.mean(entropy)), "far": float(np.mean(far))}


def run_stats(ckpt_path: Path, instances: int) -> dict[str, float]:
    """{attn/<stat>@<L + 1>/layer<l>: value, readout/<copy|entropy|far>@<L + 1>: value} of one checkpoint on
    ``instances`` probe instances per length."""
    ckpt = load_run_checkpoint(ckpt_path)
    cfg = ckpt["hyper_parameters"]["cfg"]
    train_rows = int(cfg["data"]["seq_len"]) + 1  # positions a training row reaches: 0 .. 2^8
    model = build_model(cfg["model"], cfg["pe"], int(ckpt["hyper_parameters"]["vocab_size"]), int(cfg["data"]["seq_len"]))
    model.load_state_dict(model_state(ckpt))
    model.eval()
    out: dict[str, float] = {}
    for L in LENGTHS:
        samples = make_probe_samples(INDUCTION_HEADS, VOCABULARY, L, 0.5, instances, SEED)
        tokens = torch.tensor([t for s in samples for t in s.input_ids])  # (instances * (L + 1),): one per window
        found = attention_diagnostics(model, tokens, [L + 1], train_rows, windows=instances)
        out.update(metrics(found["rows"]))
        out.update({f"readout/{k}@{L + 1}": v for k, v in readout(model, samples, train_rows).items()})
    return out


def collect(folders: list[Path], instances: int, known: set[str] = frozenset()) -> list[dict]:
    """One record per finished run under ``folders`` with a last checkpoint and not in ``known`` (the runs of earlier
    records): scheme, seed, its statistics."""
    records = []
    for summary in sorted(p for f in folders for p in f.glob("*/summary.json")):
        s = json.loads(summary.read_text())
        ckpt = summary.parent / "checkpoints" / "last.ckpt"
        if s.get("status") != "ok" or not ckpt.is_file() or summary.parent.name in known:
            continue
        records.append({"run": summary.parent.name, "scheme": s["config"]["pe"]["name"], "seed": s["config"]["seed"],
                        "stats": run_stats(ckpt, instances)})
    return records


def table(records: list[dict], n_layers: int = 2) -> str:
    """Per scheme (mean over seeds, with the seeds' range): the read-out at the query, then the diagnostics of each
    layer, at 2^8 and 2^11."""
    cols = [(f"readout/{k}@{L + 1}", f"{k} @2^{int(math.log2(L))}") for k in ("copy", "entropy", "far") for L in LENGTHS]
    cols += [(metric_key(f"attn/{stat}", L + 1, layer=layer), f"{stat} layer {layer} @2^{int(math.log2(L))}")
             for stat in STATS for layer in range(n_layers) for L in LENGTHS]
    lines = [f"| scheme | seeds | {' | '.join(h for _, h in cols)} |", "|---|---:|" + "---:|" * len(cols)]
    for scheme in sorted({r["scheme"] for r in records}):
        rs = [r for r in records if r["scheme"] == scheme]
        cells = []
        for key, _ in cols:
            v = np.array([r["stats"].get(key, math.nan) for r in rs])
            cells.append(f"{np.nanmean(v):.2f} ({np.nanmin(v):.2f}-{np.nanmax(v):.2f})" if np.isfinite(v).any()
                         else "n/a")
        lines.append(f"| {scheme} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", type=Path, help="sweep folders whose runs keep checkpoints/last.ckpt")
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--records", type=Path, nargs="+", default=[],
                    help="the records of earlier --out runs (.json): rendered with those of the folders' other runs")
    ap.add_argument("--out", type=Path, default=None, help="the table (Markdown); its records beside it as .json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    records = [r for path in a.records for r in json.loads(path.read_text())]
    seen = [r["run"] for r in records]
    if len(set(seen)) < len(seen):
        ap.error(f"--records: run {min(r for r in seen if seen.count(r) > 1)} is in more than one file")
    records += collect(a.folders, a.instances, known=set(seen))
    runs = ", ".join(sorted(r["run"] for r in records))
    text = (f"# Attention at 2^8 and 2^11 (generated by experiments/induction_schemes/attention.py)\n\n"
            f"Runs: {runs}. Per row, the mean over its runs with their range. copy / entropy / far: the last layer's "
            "head with the most attention on the answer's copy, at the query: that mass, its entropy (nats), its mass at "
            "distances >= 257. Then per layer, over heads, at the queries of the last position bucket: entropy, mean "
            "distance (tokens), mass at distances >= 257. Associations, not causes.\n\n" + table(records))
    if a.out:
        a.out.write_text(text)
        a.out.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(text, end="")


if __name__ == "__main__":
    main()
