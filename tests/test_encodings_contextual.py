"""Contextual positions (pelab.encodings.contextual): CoPE's positions, interpolation and bias against the
paper's definition, computed by a plain loop."""

from __future__ import annotations

import math

import pytest
import torch

from encoding_inputs import D, Dh, H
from pelab.encodings import build_encoding
from pelab.encodings.contextual import cope_positions, interpolate_logits


def test_cope_positions_are_suffix_sums_of_gates():
    gates = torch.tensor([[0.5, 0.9, 0.2], [0.1, 0.3, 0.7]])  # queries 1, 2 (q0 = 1) against keys 0..2
    pos = cope_positions(torch.logit(gates.double()), q0=1)  # the gates are sigmoid(logits)
    # query 1: key 2 is in the future (gate ignored): p_10 = 0.5 + 0.9, p_11 = 0.9
    assert pos[0].tolist() == pytest.approx([1.4, 0.9, 0.0])
    # query 2: p_20 = 0.1 + 0.3 + 0.7, p_21 = 0.3 + 0.7, p_22 = 0.7
    assert pos[1].tolist() == pytest.approx([1.1, 1.0, 0.7])


def test_cope_interpolates_between_integer_positions():
    logits_int = torch.tensor([[10.0, 20.0, 40.0]])  # q . e[p] for p = 0, 1, 2
    pos = torch.tensor([[1.25, 0.0, 2.0]])
    assert interpolate_logits(logits_int, pos).tolist() == [[25.0, 10.0, 40.0]]  # 0.75*20 + 0.25*40


def test_cope_content_bias_matches_the_paper_loop_and_chunks():
    torch.manual_seed(0)
    pe = build_encoding({"name": "cope", "max_position": 4}, D, H)
    with torch.no_grad():
        pe.pos_emb.normal_()
    T = 9
    q, k = torch.randn(1, H, T, Dh), torch.randn(1, H, T, Dh)
    state = pe.prepare(torch.arange(k.shape[-2]))
    full = pe.content_bias(q, k, 0, state)
    e = pe.pos_emb.t()  # (P, Dh)
    for h in range(H):
        for i in range(T):
            gates = torch.sigmoid(q[0, h, i] @ k[0, h, : i + 1].t() / math.sqrt(Dh))
            for j in range(i + 1):
                p = min(gates[j:].sum().item(), 3.0)  # clamp at npos_max - 1
                lo, hi, w = math.floor(p), math.ceil(p), p - math.floor(p)
                expected = (1 - w) * (q[0, h, i] @ e[lo]) + w * (q[0, h, i] @ e[hi])
                assert full[0, h, i, j].item() == pytest.approx(expected.item(), abs=1e-4)
    # a query chunk q0..q1-1 against keys 0..q1-1 gives the same rows
    torch.testing.assert_close(pe.content_bias(q[..., 4:7, :], k[..., :7, :], 4, state), full[..., 4:7, :7])
