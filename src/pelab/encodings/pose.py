"""PoSE positions (Zhu et al., ICLR 2024, "PoSE: Efficient Context Window Extension of LLMs via Positional Skip-wise
Training", arXiv 2309.10400; reference dwzhu-pku/PoSE src/train_pose.py, ``train_preprocess_function_pose``):
training rows of L_c tokens whose position ids jump, so that fine-tuning at L_c reaches every relative position of a
target window L_t > L_c.

Per row, as the reference: two chunks (the paper's N = 2); the first holds the first l_0 ~ U{1..ceil(L_c / 2)}
tokens at positions 0..l_0-1 (skipping bias u_0 = 0); the second, the other L_c - l_0 tokens, moves on by a skipping
bias u_1 ~ U{0..L_t - L_c}: positions l_0 + u_1 .. L_c - 1 + u_1 <= L_t - 1. Combined with PI or YaRN by the run's
``pe.scaling`` (the paper's factor L_t / L_c).

Deviation: the reference also skips CONTENT (the second chunk's tokens come from up to 5 x L_c further into the
document, its v_1); PELab's rows are windows of L_c + 1 contiguous tokens, so its content is contiguous (the paper's
v_i = 0 variant, which it reports makes "relatively little" difference: Appendix A, Table 4).

Used by the training step (``LMModule``) when ``extend.pose_length`` is set; the draws use torch's global RNG, which
the module seeds from (seed, step, rank) before every step, so a resumed run draws the same positions.
"""

from __future__ import annotations

import torch
from torch import Tensor


def pose_positions_of(first: Tensor, skip: Tensor, length: int) -> Tensor:
    """Positions (B, length): 0..first-1, then first + skip .. length - 1 + skip; ``first``, ``skip`` (B,) ints."""
    pos = torch.arange(length, device=first.device).expand(first.shape[0], length)
    return pos + skip[:, None] * (pos >= first[:, None])


def pose_positions(batch: int, length: int, target_length: int, device: torch.device | None = None) -> Tensor:
    """(batch, length) PoSE positions for rows of ``length`` tokens covering ``target_length`` (> length) positions:
    each row its own draw of the first chunk's length and the second chunk's skipping bias (module docstring)."""
    first = torch.randint(1, (length + 1) // 2 + 1, (batch,), device=device)  # random.randint(1, (L_c + 1) // 2)
    skip = torch.randint(0, target_length - length + 1, (batch,), device=device)  # random.randint(0, L_t - L_c)
    return pose_positions_of(first, skip, length)
