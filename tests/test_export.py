"""pelab.export: a PELab RoPE model as transformers' GPT-NeoX gives PELab's logits."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from helpers.runs import FAST, compose
from pelab.errors import ConfigError
from pelab.export import hf_tokenizer, main, neox_config, neox_state_dict
from pelab.model import build_model

transformers = pytest.importorskip("transformers")

V, L = 300, 32


def run_config(overrides: list[str]) -> dict:
    """The groups of FAST + overrides that export reads, as a training checkpoint stores them (resolved)."""
    cfg = compose([*FAST, *overrides])
    return {g: OmegaConf.to_container(cfg[g], resolve=True) for g in ("pe", "model", "data")}


def pelab_and_neox(overrides: list[str]) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A randomly initialised PELab GPT of FAST + overrides and the GPT-NeoX built from its config and weights."""
    cfg = run_config(overrides)
    torch.manual_seed(0)
    model = build_model(OmegaConf.create(cfg["model"]), OmegaConf.create(cfg["pe"]), V, L).eval()
    with torch.no_grad():  # biases away from their zero init, so that a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    config = transformers.GPTNeoXConfig(**neox_config(cfg, V, eot_id=256))
    neox = transformers.GPTNeoXForCausalLM(config).eval()
    neox.load_state_dict(neox_state_dict(model.state_dict(), config.num_hidden_layers,
                                         config.num_attention_heads), strict=True)
    return model, neox


@pytest.mark.parametrize("overrides", [
    [],
    ["model.bias=true", "model.tie_embeddings=false", "pe.rotary_fraction=0.5", "pe.base=500"],
    ["model.bias=true", "pe.scaling.type=linear", "pe.scaling.factor=2"],
    ["pe.scaling.type=yarn", "pe.scaling.factor=4"],
], ids=["default", "bias-untied-partial", "linear", "yarn"])
def test_neox_logits_equal_pelabs_past_the_training_length(overrides):
    model, neox = pelab_and_neox(overrides)
    x = torch.randint(0, V, (2, 3 * L))  # 3 x the training length: the scaled positions too
    with torch.no_grad():
        torch.testing.assert_close(neox(x).logits, model(x), atol=1e-5, rtol=1e-5)


def test_a_run_exports_and_loads_with_from_pretrained(reference, tmp_path, capsys):
    """pelab-export on a trained run folder; AutoModelForCausalLM loads it and gives the checkpoint's logits."""
    from pelab.tasks.evaluate import load_model
    from pelab.training.checkpoints import load_run_checkpoint

    assert main([str(reference), str(tmp_path / "hf")]) == 0
    assert "GPT-NeoX" in capsys.readouterr().out
    neox = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ckpt = load_run_checkpoint(reference / "checkpoints" / "last.ckpt")
    model = load_model(OmegaConf.create(ckpt["hyper_parameters"]["cfg"]), ckpt, neox.config.vocab_size)
    x = torch.randint(0, neox.config.vocab_size, (1, 64))
    with torch.no_grad():
        torch.testing.assert_close(neox(x).logits, model.eval()(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_the_exported_tokenizer_gives_pelabs_ids(kind, byte_tok, bpe_tok, tmp_path):
    """AutoTokenizer of the export = PELab's encode, a literal end-of-document or reserved-key string included (text
    in both), and decode back; the reserved ids are named <kN> / <vN> at PELab's ids."""
    tok = byte_tok if kind == "byte" else bpe_tok
    hf_tokenizer(tok).save_pretrained(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for text in ["def f(x):\n\treturn 'héllo wörld' + x  # ∑\n", "a <|endoftext|> b <k0> c"]:
        assert hf(text, add_special_tokens=False).input_ids == list(tok.encode(text))
        assert hf.decode(tok.encode(text)) == text
    assert hf.convert_tokens_to_ids(["<k0>", "<v0>"]) == [tok.reserved_key_ids.start, tok.reserved_value_ids.start]
    assert hf.eos_token_id == tok.eot_id and len(hf) == tok.vocab_size


@pytest.mark.parametrize("overrides,key", [(["pe=alibi"], "pe=alibi"), (["model.d_ff=0"], "model.d_ff"),
                                           (["pe.scaling.type=ntk", "pe.scaling.factor=2"], "pe.scaling.type=ntk")])
def test_what_gpt_neox_cannot_express_is_refused_naming_the_setting(overrides, key):
    cfg = run_config(overrides)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        neox_config(cfg, V, eot_id=256)
