"""How fast model=recall learns a RULER-style kind, without Lightning: experiment=recall's recipe in a plain loop
(d = 128, 2 layers, 2 heads, kaiming init, untied head, byte tokenizer, L = 128, batches of 32 recall rows over
standard-library text, loss on the answers only, AdamW 1e-3 with betas (0.9, 0.98), weight decay 0.1 on matrices,
50 warm-up steps, gradient clipping 1.0, the curriculum's spans), the in-window accuracy every `--every` steps on 120
fixed probe instances (3 depths x 40, 128 tokens, validation text). Used to choose the kinds' form, their scoring and
the presets' curricula (README.md); --layers / --heads change the model. One thread:
  OMP_NUM_THREADS=1 python experiments/ruler/plain_loop.py --kinds niah_multikey --curriculum 0:16,200:64,400:128
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pelab.data.recall import make_probe_samples, make_recall_batch
from pelab.data.tokenizer import ByteTokenizer
from pelab.evaluation.probes import score_samples
from pelab.model import build_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="niah_multikey", help="comma-separated kinds of the mix")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--curriculum", default="0:16,200:64,400:128", help="step:span,...")
    ap.add_argument("--ruler", default="", help="data.recall_ruler overrides, e.g. distractor_keys=7")
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--stop", type=float, default=0.97, help="stop once every kind reaches this accuracy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    tok = ByteTokenizer()
    kinds = a.kinds.split(",")
    ruler = {k: int(v) for k, v in (x.split("=") for x in a.ruler.split(",") if x)}
    files = sorted(glob.glob(os.path.dirname(os.__file__) + "/*.py"))[:80]
    text = np.frombuffer(b"".join(Path(f).read_bytes() for f in files), dtype=np.uint8).astype(np.int64)
    train_text, val_text = text[: -len(text) // 10], text[-len(text) // 10 :]
    model = build_model({"n_layers": a.layers, "n_heads": a.heads, "d_model": 128, "init": "kaiming", "tie_embeddings": False},
                        {"name": "rope"}, tok.vocab_size, 128)
    params = list(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.98))
    spans = sorted((int(s), int(w)) for s, w in (x.split(":") for x in a.curriculum.split(",") if x))
    probes = {k: [s for d in (0.0, 0.5, 1.0) for s in make_probe_samples(
        k, tok, 128, d, 40, 4321, filler_ids=val_text[:4096].tolist(), ruler=ruler)] for k in kinds}
    g, rng, t0 = np.random.default_rng(a.seed), random.Random(a.seed), time.time()
    for step in range(a.steps + 1):
        if step % a.every == 0:
            accs = {k: sum(r.correct for r in score_samples(model, ss)) / len(ss) for k, ss in probes.items()}
            # a kind scored in any order (niah_multiquery, as RULER) also in its gold order
            fixed = {k: sum(r.correct for r in score_samples(model, [replace(s, any_order=False) for s in ss]))
                     / len(ss) for k, ss in probes.items() if ss[0].any_order}
            print(f"step {step} {time.time() - t0:.0f}s " + " ".join(f"{k}={v:.2f}" for k, v in accs.items())
                  + "".join(f" {k}(gold order)={v:.2f}" for k, v in fixed.items()), flush=True)
            if min(accs.values()) >= a.stop:
                break
        span = max((w for s, w in spans if step >= s), default=None)
        for group in opt.param_groups:
            group["lr"] = 1e-3 * min(1.0, (step + 1) / 50)
        rows = train_text[g.integers(len(train_text) - 130, size=32)[:, None] + np.arange(129)]
        x, m = make_recall_batch(tok, 128, 32, rng, kinds=kinds, return_mask=True, span=span, text=rows, ruler=ruler)
        model.train()
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits[m[:, 1:]], x[:, 1:][m[:, 1:]])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    print(f"done {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
