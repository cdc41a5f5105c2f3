"""A PELab RoPE checkpoint as a Hugging Face `transformers` model: GPT-NeoX, which matches PELab's GPT exactly.

PELab's block is pre-norm LayerNorm -> attention -> residual, LayerNorm -> GELU MLP -> residual (nanoGPT), RoPE with
half-split pairs. GPT-NeoX with ``use_parallel_residual=False`` is that block (Llama is not: RMSNorm and SwiGLU);
its rotary embedding rotates half-split pairs too (``rotate_half``), its ``partial_rotary_factor`` is PELab's
``pe.rotary_fraction``. What differs is only the layout of the fused q/k/v projection (PELab's rows are
(q | k | v) x heads, NeoX's heads x (q | k | v)) and the biases NeoX always has (set to zero when the model has
none). Checked by tests/test_export.py: the exported model's logits equal PELab's (transformers 5 as installed).

    pelab-export <run folder or .ckpt> <out folder>
    AutoModelForCausalLM.from_pretrained(<out folder>)

Every other model (ALiBi, T5, FIRE, ..., a layout, stick-breaking attention) has no native architecture in
`transformers`: it is exported with remote code (``pelab.remote_code``: PELab's own forward, copied, no `import
pelab`) and loads with ``trust_remote_code=True``; ``--remote-code`` exports a RoPE model that way too. When the run
logged to W&B, the export is logged as a ``model`` artifact of that run (``--no-wandb``: not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from pelab.errors import ConfigError

# pe.scaling.type -> HF rope_type (pelab.encodings' RoPE scalings are checked against HF's rope utils)
ROPE_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn"}


def neox_config(cfg: Any, vocab_size: int, eot_id: int) -> dict:
    """The GPTNeoXConfig keywords of a PELab run's config (`cfg`: its resolved training config), or a one-line
    ConfigError naming the setting that has no GPT-NeoX equivalent."""
    pe, model = cfg["pe"], cfg["model"]
    if pe["name"] != "rope":
        raise ConfigError(f"pe={pe['name']}: only RoPE models map onto a transformers architecture (GPT-NeoX); "
                          "export a pe=rope run.")
    d_ff = 4 * model["d_model"] if model.get("d_ff") is None else model["d_ff"]  # GPTConfig's default
    unsupported = {"pe.frequency_fraction": pe.get("frequency_fraction", 1.0) != 1.0,
                   "model.layout": bool(model.get("layout")),
                   "model.d_ff": d_ff == 0,  # attention-only blocks
                   "model.attention": model.get("attention", "softmax") != "softmax",
                   "model.attn_logit_scale": model.get("attn_logit_scale") not in (None, "none"),
                   "pe.randomized": bool((pe.get("randomized") or {}).get("max_position"))}
    for key, bad in unsupported.items():
        if bad:
            raise ConfigError(f"{key}: this run's setting has no GPT-NeoX equivalent; export a run without it.")
    scaling = pe.get("scaling") or {"type": "none"}
    if scaling["type"] not in ROPE_TYPES:
        raise ConfigError(f"pe.scaling.type={scaling['type']}: GPT-NeoX export maps {', '.join(ROPE_TYPES)}; "
                          "export with one of them (pelab-export --pe.scaling.type=none).")
    rope = {"rope_type": ROPE_TYPES[scaling["type"]], "rope_theta": float(pe["base"]),
            "partial_rotary_factor": float(pe.get("rotary_fraction", 1.0))}
    if scaling["type"] != "none":
        rope["factor"] = float(scaling["factor"])
    if scaling["type"] == "yarn":
        rope.update(beta_fast=float(scaling["beta_fast"]), beta_slow=float(scaling["beta_slow"]),
                    original_max_position_embeddings=int(cfg["data"]["seq_len"]))
    return {"vocab_size": vocab_size, "hidden_size": model["d_model"], "num_hidden_layers": model["n_layers"],
            "num_attention_heads": model["n_heads"], "intermediate_size": d_ff, "hidden_act": "gelu",
            "use_parallel_residual": False, "attention_bias": True, "layer_norm_eps": 1e-5, "attention_dropout": 0.0,
            "hidden_dropout": 0.0, "max_position_embeddings": int(cfg["data"]["seq_len"]),
            "tie_word_embeddings": bool(model.get("tie_embeddings")), "rope_parameters": rope,
            "bos_token_id": eot_id, "eos_token_id": eot_id}


def neox_state_dict(state: dict[str, torch.Tensor], n_layers: int, n_heads: int) -> dict[str, torch.Tensor]:
    """PELab GPT weights (`model_state`) renamed and laid out as GPTNeoXForCausalLM's; absent biases as zeros."""
    def bias(key: str, like: torch.Tensor) -> torch.Tensor:
        return state[key] if key in state else torch.zeros(like.shape[0], dtype=like.dtype)

    def per_head(t: torch.Tensor) -> torch.Tensor:  # rows (3, H, Dh) -> (H, 3, Dh): NeoX views qkv per head
        return t.reshape(3, n_heads, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    out = {"gpt_neox.embed_in.weight": state["tok_emb.weight"], "lm_head.weight": state["lm_head.weight"],
           "gpt_neox.final_layer_norm.weight": state["ln_f.weight"],
           "gpt_neox.final_layer_norm.bias": bias("ln_f.bias", state["ln_f.weight"])}
    for i in range(n_layers):
        p, q = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        qkv = state[p + "attn.qkv.weight"]
        pairs = {"input_layernorm": "ln_1", "post_attention_layernorm": "ln_2", "attention.dense": "attn.proj",
                 "mlp.dense_h_to_4h": "mlp.fc", "mlp.dense_4h_to_h": "mlp.proj"}
        for neox, pelab in pairs.items():
            out[q + neox + ".weight"] = state[p + pelab + ".weight"]
            out[q + neox + ".bias"] = bias(p + pelab + ".bias", state[p + pelab + ".weight"])
        out[q + "attention.query_key_value.weight"] = per_head(qkv)
        out[q + "attention.query_key_value.bias"] = per_head(bias(p + "attn.qkv.bias", qkv))
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def export_run(checkpoint: str | Path, out: str | Path, *, remote_code: bool = False,
               wandb: bool = True) -> tuple[Path, str]:
    """Write `out`: the model for `AutoModelForCausalLM.from_pretrained` (GPT-NeoX when it maps exactly and
    `remote_code` is off; else PELab's remote code, ``pelab.remote_code``), the run's tokenizer for `AutoTokenizer`
    (``hf_tokenizer``) and `pelab_export.json` (the source checkpoint, its config, the end-of-document id, the
    architecture). With `wandb`, a run that logged to W&B gets the folder as a `model` artifact
    (``log_export_artifact``). Returns the folder and the architecture ("gpt_neox" or "remote_code")."""
    from pelab.runs.folder import resolve_ckpt_path
    from pelab.training.checkpoints import load_run_checkpoint, model_state

    path = Path(resolve_ckpt_path(str(checkpoint), Path.cwd()))
    ckpt = load_run_checkpoint(path, key="checkpoint")
    cfg, vocab_size = ckpt["hyper_parameters"]["cfg"], int(ckpt["hyper_parameters"]["vocab_size"])
    tokenizer = run_tokenizer(cfg)
    eot_id = int(tokenizer.eot_id)
    out = Path(out)
    try:
        native = None if remote_code else neox_config(cfg, vocab_size, eot_id)
    except ConfigError:  # no transformers architecture matches: PELab's own code
        native = None
    if native is not None:
        from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

        config = GPTNeoXConfig(**native)
        model = GPTNeoXForCausalLM(config)
        model.load_state_dict(neox_state_dict(model_state(ckpt), config.num_hidden_layers,
                                              config.num_attention_heads), strict=True)
        model.save_pretrained(out)
    else:
        from pelab.remote_code import write_remote

        write_remote(out, cfg, model_state(ckpt), vocab_size, eot_id)
    arch = "gpt_neox" if native is not None else "remote_code"
    hf_tokenizer(tokenizer).save_pretrained(out)
    (out / "pelab_export.json").write_text(json.dumps(
        {"checkpoint": str(path.resolve()), "architecture": arch, "eot_id": eot_id, "tokenizer": cfg["tokenizer"],
         "config": cfg}, indent=1, default=str))
    if wandb:
        log_export_artifact(path.parent.parent, cfg, out, arch)
    return out, arch


def log_export_artifact(run_folder: Path, cfg: dict, out: Path, arch: str) -> str | None:
    """The exported folder as a `model` artifact (``hf-<run id>``) of the W&B run that trained it: that run's id,
    resumed (``pelab.runs.loggers.init_wandb``), so online the artifact joins the run and offline ``wandb sync``
    uploads it into the run. None when the run logged no W&B run (no `wandb_run_id.txt`, or `logger.wandb` off)."""
    from pelab.runs.loggers import RUN_ID_FILE, finish_wandb, init_wandb

    wcfg = (cfg.get("logger") or {}).get("wandb")
    if not wcfg or not (run_folder / RUN_ID_FILE).is_file():
        return None
    import wandb

    name = json.loads((run_folder / "summary.json").read_text()).get("name", run_folder.name) \
        if (run_folder / "summary.json").is_file() else run_folder.name
    run = init_wandb(wcfg, name=name, output_dir=run_folder, config={}, group=None, tags=cfg.get("tags"))
    if run is None:
        return None
    try:
        artifact = wandb.Artifact(f"hf-{run.id}", type="model",
                                  metadata={"architecture": arch, "format": "transformers"})
        artifact.add_dir(str(out))
        run.log_artifact(artifact)
    finally:
        finish_wandb(run, exit_code=0)
    print(f"W&B: {out} logged as artifact hf-{run.id} (type model) of run {run.id} ({run.settings.mode})")
    return f"hf-{run.id}"


def run_tokenizer(cfg: dict) -> Any:
    """The run's PELab tokenizer: byte-level rebuilt from its settings, a BPE / hub one from the token cache."""
    from omegaconf import OmegaConf

    from pelab.data.disk import resolve_cache_root
    from pelab.data.tokenizer import make_tokenizer
    from pelab.runs.build import build_datamodule
    from pelab.tasks.evaluate import todays_form

    if cfg["tokenizer"]["kind"] == "byte":
        return make_tokenizer(cfg["tokenizer"])
    c = OmegaConf.create(todays_form(cfg))  # its DataModule is built again: named as today (data._target_)
    c.paths.cache_dir = str(resolve_cache_root())
    datamodule = build_datamodule(c, 1)
    datamodule.setup("validate")
    return datamodule.tokenizer


def hf_tokenizer(tok: Any) -> Any:
    """`tok` (a PELab tokenizer) as a `PreTrainedTokenizerFast` giving the same ids: byte-level as a BPE of the
    256 bytes without merges (GPT-2's byte-to-character map), a BPE / hub tokenizer as itself; then the
    reserved key / value ids as added tokens <k0>... <v0>... at PELab's ids. `split_special_tokens`: a text that
    spells "<|endoftext|>" or "<k0>" is text, as PELab encodes it (`encode_special_tokens`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from pelab.data.tokenizer import EOT

    if tok.kind == "byte":
        chars = bytes_to_unicode()
        tk = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([EOT])
        eot = EOT
    else:
        tk, eot = Tokenizer.from_str(tok.tk.to_str()), tok.eot_token
    if tk.get_vocab_size(with_added_tokens=True) != tok.base_vocab_size:
        raise ConfigError(f"tokenizer.kind={tok.kind}: its ids have holes, so the reserved ids cannot be added at "
                          "PELab's positions; export with the weights only.")
    tk.add_special_tokens([f"<k{i}>" for i in range(len(tok.reserved_key_ids))]
                          + [f"<v{i}>" for i in range(len(tok.reserved_value_ids))])
    assert tk.get_vocab_size(with_added_tokens=True) == tok.vocab_size and tk.token_to_id(eot) == tok.eot_id
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=eot, bos_token=eot, split_special_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pelab-export", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a run folder (its newest checkpoint) or a .ckpt file")
    parser.add_argument("out", help="the folder to write (transformers' save_pretrained layout)")
    parser.add_argument("--remote-code", action="store_true",
                        help="PELab's own code (trust_remote_code) even where GPT-NeoX maps the model exactly")
    parser.add_argument("--no-wandb", action="store_true", help="do not log the export as a W&B artifact of the run")
    args = parser.parse_args(argv)
    try:
        out, arch = export_run(args.checkpoint, args.out, remote_code=args.remote_code, wandb=not args.no_wandb)
    except ConfigError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    how = ("GPT-NeoX; AutoModelForCausalLM.from_pretrained('{}')" if arch == "gpt_neox" else
           "PELab remote code; AutoModelForCausalLM.from_pretrained('{}', trust_remote_code=True)").format(out)
    print(f"exported {args.checkpoint} -> {out} ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
