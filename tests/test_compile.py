"""`compile: true` on CPU: the compiled model trains with the eager model's numbers.

Representative schemes only (inductor compiles cost tens of seconds on a busy CPU); every scheme is checked by
experiments/benchmarks/compile_check.py (results in experiments/benchmarks/README.md)."""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

from pelab.encodings import default_pe_config
from pelab.model import build_model
from pelab.training.module import LMModule

MICRO = {"n_layers": 1, "n_heads": 2, "d_model": 32}
V, B, T = 64, 2, 32


def _loss_and_grads(model, x, params):
    logits = model(x)
    return logits.detach(), torch.autograd.grad(logits.square().mean(), params)


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["rope", "cope", "sandwich"])
def test_scheme_compiles_as_one_graph_with_eager_numbers(scheme):
    """The whole training forward is one graph (fullgraph=True: no graph break, e.g. RoPE's out= buffers,
    Sandwich's data-dependent range, CoPE's per-layer content bias), and forward and gradients equal eager.
    aot_eager: dynamo + AOTAutograd, as inductor sees them, without inductor's C++ compile."""
    torch.manual_seed(0)
    model = build_model(MICRO, default_pe_config(scheme), V, T)
    x = torch.randint(0, V, (B, T))
    params = [p for p in model.parameters() if p.requires_grad]
    want = _loss_and_grads(model, x, params)
    got = _loss_and_grads(torch.compile(model, dynamic=False, fullgraph=True, backend="aot_eager"), x, params)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-6)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_a_layout_compiles_as_one_graph_with_eager_numbers():
    """Local spans, both temperatures, q/k norm, head mixing and a second encoding: still one graph (~2 s)."""
    torch.manual_seed(0)
    layout = ["rope@chunk:8+qk_norm+ssmax", "nope+llama4_temp", "alibi@window:8", "rope+rotate_heads:1"]
    model = build_model({**MICRO, "n_layers": 4, "layout": layout}, default_pe_config("rope"), V, T)
    x = torch.randint(0, V, (B, T))
    params = [p for p in model.parameters() if p.requires_grad]
    want = _loss_and_grads(model, x, params)
    got = _loss_and_grads(torch.compile(model, dynamic=False, fullgraph=True, backend="aot_eager"), x, params)
    torch.testing.assert_close(got[0], want[0], atol=1e-6, rtol=1e-6)
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_compile_true_trains_t5_bias_with_eager_numbers():
    """LMModule.net (what `compile: true` trains) through inductor for T5's learned per-distance bias (its
    custom-gradient view, the explicit-softmax path): a training forward + backward and a validation forward
    at another batch size (static shapes: a recompile) equal the eager model's. ~20-50 s (C++ compile)."""
    cfg = {"data": {"seq_len": T}, "compile": True, "model": MICRO, "pe": default_pe_config("t5_bias"), "optim": {}}
    torch.manual_seed(0)
    module = LMModule(cfg, vocab_size=V)
    with torch.no_grad():
        module.model.pe.table.weight.mul_(10)  # make the bias matter
    x = torch.randint(0, V, (B, T))
    params = [p for p in module.model.parameters() if p.requires_grad]
    with inductor_config.patch(force_disable_caches=True):  # a shared on-disk cache has returned broken kernels
        got = _loss_and_grads(module.net, x, params)
        want = _loss_and_grads(module.model, x, params)
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=1e-5)
        for g, w in zip(got[1], want[1], strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        assert module.net is not module.model and module.net is module.net  # compiled once, then reused
        module.eval()
        xv = torch.randint(0, V, (B + 1, T))
        with torch.no_grad():
            torch.testing.assert_close(module.net(xv), module.model(xv), atol=1e-5, rtol=1e-5)
