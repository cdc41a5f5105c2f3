"""Training step time of the data-dependent schemes (and FoPE) relative to RoPE, on CPU, one thread, in a plain loop.

    OMP_NUM_THREADS=1 python experiments/data_dependent/step_time.py --json experiments/data_dependent/measurements/step_time-cpu.json

A step is forward + cross-entropy + backward + AdamW on a random-token batch held in memory, on the study model
(``conf/model/recall.yaml``: d 128, 2 layers, 2 heads of 64) at L = 128, batch 32 (``data.batch_size``). Steps
are interleaved (one step of every case per round), so that every case sees the same machine load; the clock is
process CPU time (``time.process_time``), which with one thread does not count the time other processes hold the
cores. Reported: each case's median step and the median of its per-round ratio to RoPE's step of the same round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from pelab.model import build_model

# label -> (pe config, model keys beside conf/model/recall.yaml's)
CASES = {
    "rope": ({"name": "rope"}, {}),
    "nope": ({"name": "nope"}, {}),
    "alibi": ({"name": "alibi"}, {}),
    "fox": ({"name": "fox"}, {}),
    "fox_rope": ({"name": "fox", "rope": True}, {}),
    "stickbreaking": ({"name": "nope"}, {"attention": "stickbreaking"}),
    "fope": ({"name": "fope"}, {}),
}
RECALL = {"n_layers": 2, "n_heads": 2, "d_model": 128, "init": "kaiming", "tie_embeddings": False}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--steps", type=int, default=20, help="timed rounds (one step of every case each)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    models, optims = {}, {}
    for label, (pe, keys) in CASES.items():
        torch.manual_seed(0)
        models[label] = build_model({**RECALL, **keys}, pe, a.vocab, a.seq).train()
        optims[label] = torch.optim.AdamW(models[label].parameters(), lr=1e-3)
    batch = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=torch.Generator().manual_seed(0))
    times: dict[str, list[float]] = {label: [] for label in CASES}
    for step in range(a.warmup + a.steps):
        for label, model in models.items():
            t0 = time.process_time()
            logits = model(batch[:, :-1])
            F.cross_entropy(logits.reshape(-1, a.vocab), batch[:, 1:].reshape(-1)).backward()
            optims[label].step()
            optims[label].zero_grad(set_to_none=True)
            if step >= a.warmup:
                times[label].append(time.process_time() - t0)
    rows = [{"case": label, "median_step_s": statistics.median(ts),
             "ratio_to_rope": statistics.median(t / r for t, r in zip(ts, times["rope"], strict=True))}
            for label, ts in times.items()]
    for r in rows:
        print(f"{r['case']:>14}  {r['median_step_s'] * 1e3:7.1f} ms  x{r['ratio_to_rope']:.2f} of RoPE")
    out = {"rows": rows, "settings": vars(a), "model": RECALL, "threads": 1, "clock": "process_time",
           "torch": torch.__version__}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
