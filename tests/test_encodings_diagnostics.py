"""Diagnostics of an encoding (pelab.encodings.diagnostics): neighbour similarity, the report, its figures."""

from __future__ import annotations

import torch

from pelab.encodings import build_encoding
from pelab.encodings.diagnostics import (
    encoding_report,
    neighbour_cosine,
    plot_neighbour_cosine,
    plot_table_heatmap,
)


def test_neighbour_cosine_sinusoidal_high_learned_near_zero():
    torch.manual_seed(0)
    sin_table = build_encoding({"name": "sinusoidal"}, 64, 4).diagnostics(128)["table"]
    cos = neighbour_cosine(sin_table)
    assert cos.shape == (127,)
    # PE(p+1) is a fixed rotation of PE(p): the cosine is the same for every p, and high
    assert cos.min() > 0.5 and (cos.max() - cos.min()) < 1e-4
    learned = build_encoding({"name": "learned", "max_position": 128}, 64, 4)
    assert neighbour_cosine(learned.diagnostics(500)["table"]).abs().mean() < 0.15


def test_encoding_report_and_figures(tmp_path):
    from matplotlib.figure import Figure

    rep = encoding_report(build_encoding({"name": "sinusoidal"}, 32, 4), 64, figures=True)
    assert rep["num_learnable_params"] == 0 and rep["max_position"] is None and rep["hooks"] == ["embed"]
    assert rep["neighbour_cosine_min"] > 0.5
    assert set(rep["figures"]) == {"table_heatmap", "neighbour_cosine"}
    for name, fig in rep["figures"].items():
        assert isinstance(fig, Figure)
        fig.savefig(tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
    rep = encoding_report(build_encoding({"name": "learned", "max_position": 16}, 32, 4), 64)
    assert rep["num_learnable_params"] == 16 * 32 and rep["max_position"] == 16
    assert "neighbour_cosine_mean" in rep and "figures" not in rep
    rep = encoding_report(build_encoding({"name": "t5_bias"}, 32, 4), 64)
    assert rep["hooks"] == ["score_bias"] and rep["num_learnable_params"] == 32 * 4
    assert "neighbour_cosine_mean" not in rep
    for name in ("alibi", "t5_bias", "kerple", "sandwich", "fire"):
        rep = encoding_report(build_encoding({"name": name}, 32, 4, train_length=64), 64, figures=True)
        assert set(rep["figures"]) == {"bias_by_distance"}, name
    rep = encoding_report(build_encoding({"name": "cope", "max_position": 16}, 32, 4), 64, figures=True)
    assert rep["hooks"] == ["content_bias"] and rep["figures"] == {}
    assert isinstance(plot_table_heatmap(torch.randn(8, 4)), Figure)
    assert isinstance(plot_neighbour_cosine({"a": torch.rand(7), "b": torch.rand(7)}), Figure)
