"""Absolute schemes (pelab.encodings.absolute): the sinusoid is exactly Vaswani et al.'s; a learned table has
its rows and refuses positions past them as a user error."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.encodings import embed
from pelab.encodings import build_encoding
from pelab.errors import PositionOutOfRange, is_user_error


# ---- sinusoidal --------------------------------------------------------------------------------------------
def test_sinusoidal_matches_formula_elementwise():
    pe = build_encoding({"name": "sinusoidal"}, 16, 2)
    positions = [0, 1, 2, 7, 63, 1000, 5000]  # no table: any position works
    table = pe.table(torch.tensor(positions))
    for row, p in enumerate(positions):
        for i in range(8):
            angle = p / 10000 ** (2 * i / 16)
            assert table[row, 2 * i].item() == pytest.approx(math.sin(angle), abs=2e-4 + 1e-6 * p)
            assert table[row, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-4 + 1e-6 * p)
    x = torch.randn(3, len(positions), 16)
    assert pe.scale == 0.02  # default: the token embeddings' init std (see Sinusoidal)
    torch.testing.assert_close(embed(pe, x, torch.tensor(positions)), x + 0.02 * table)
    raw = build_encoding({"name": "sinusoidal", "scale": 1.0}, 16, 2)
    torch.testing.assert_close(embed(raw, x, torch.tensor(positions)), x + table)


def test_sinusoidal_shift_is_a_fixed_rotation():
    """PE(p+k) = M_k PE(p) with M_k block-diagonal 2x2 rotations that do not depend on p."""
    d, k = 16, 5
    pe = build_encoding({"name": "sinusoidal"}, d, 2)
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        w = k / 10000 ** (2 * i / d)
        # [sin(a+w), cos(a+w)] = [[cos w, sin w], [-sin w, cos w]] @ [sin a, cos a]
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(w), math.sin(w)], [-math.sin(w), math.cos(w)]]
        )
    p = torch.arange(0, 60)
    before, after = pe.table(p).double(), pe.table(p + k).double()
    torch.testing.assert_close(before @ M.T, after, atol=1e-5, rtol=0)
    # and a different shift gives a different map: M_k is specific to k
    assert (pe.table(p + k + 1).double() - before @ M.T).abs().max() > 0.1


# ---- learned -----------------------------------------------------------------------------------------------
def test_learned_params_init_and_error_beyond_table():
    pe = build_encoding({"name": "learned", "max_position": 256}, 64, 4)
    assert pe.n_positions == 256
    assert pe.num_learnable_params() == 256 * 64
    assert abs(pe.weight.weight.std().item() - 0.02) < 0.002
    pe.check_positions(torch.arange(256))  # last row exists
    with pytest.raises(PositionOutOfRange, match=r"end at 255 \(pe.max_position=256\); got position 511"):
        pe.check_positions(torch.arange(300, 512))
    with pytest.raises(PositionOutOfRange, match="pe.max_position"):
        pe.check_positions(largest=256)
    # past the table: the check comes before the lookup (an IndexError otherwise) and the error is a user
    # error, printed as one line naming the key (`Error: ...`), not a traceback
    with pytest.raises(PositionOutOfRange) as err:
        embed(pe, torch.zeros(1, 300, 64), torch.arange(300))
    assert is_user_error(err.value) and "\n" not in str(err.value) and "pe.max_position=256" in str(err.value)
    # unbounded encodings never complain
    build_encoding({"name": "sinusoidal"}, 64, 4).check_positions(torch.tensor([10**6]))
