"""A PELab model for Hugging Face `transformers` (``trust_remote_code=True``), written by ``pelab-export``.

The forward pass is PELab's own GPT (``pelab_model_gpt.py``, copied from the PELab that trained the model, its
imports made relative); its encoding is built from the settings recorded in config.json (``pe``, ``layer_pes``).
No key/value cache: each forward reads the whole sequence, as PELab's evaluation does.

    AutoModelForCausalLM.from_pretrained(<folder>, trust_remote_code=True)

This file is package data of PELab (src/pelab/remote/); it imports only what the export folder holds.
"""

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from .pelab_encodings import RECORDED, build_encoding
from .pelab_model_config import GPTConfig
from .pelab_model_gpt import GPT


class PelabConfig(PretrainedConfig):
    """``gpt``: PELab's GPTConfig fields; ``pe``: the run's encoding settings; ``layer_pes``: a layout's others."""

    model_type = "pelab"

    def __init__(self, gpt=None, pe=None, layer_pes=None, vocab_size=None, **kwargs):
        self.gpt = gpt or {}
        self.pe = pe or {}
        self.layer_pes = layer_pes or {}
        self.vocab_size = vocab_size
        super().__init__(**kwargs)


class PelabForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = PelabConfig
    base_model_prefix = "gpt"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]  # noqa: RUF012 - transformers reads a list

    def __init__(self, config):
        super().__init__(config)
        RECORDED.clear()
        RECORDED.update(config.layer_pes)
        pe = build_encoding(dict(config.pe), config.gpt["d_model"], config.gpt["n_heads"])
        self.gpt = GPT(GPTConfig(**config.gpt), pe)
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"gpt.lm_head.weight": "gpt.tok_emb.weight"}
        self.post_init()

    def _init_weights(self, module):
        """PELab's GPT initialises its parameters itself and loaded weights replace them. What the weights file
        does not hold are an encoding's non-persistent buffers (RoPE's inverse frequencies, ALiBi's slopes, ...):
        `from_pretrained` builds the model on the meta device, so they are recomputed here, from an encoding
        built on the CPU with the same settings, as transformers' own models recompute ``inv_freq``."""
        buffers = getattr(module, "_non_persistent_buffers_set", ())
        if not buffers or not hasattr(module, "prepare"):  # not an encoding, or one without such buffers
            return
        settings = self.config.pe if module.name == self.config.pe["name"] else self.config.layer_pes[module.name]
        with torch.device("cpu"):
            fresh = build_encoding(dict(settings), module.d_model, module.n_heads)
        with torch.no_grad():
            for name in buffers:
                getattr(module, name).copy_(getattr(fresh, name))

    def get_input_embeddings(self):
        return self.gpt.tok_emb

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        """input_ids (B, T) -> logits (B, T, V). A padding mask is not supported: PELab scores unpadded rows."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("PelabForCausalLM takes unpadded rows (attention_mask all ones); score rows one by one")
        logits = self.gpt(input_ids)
        loss = None
        if labels is not None:  # next-token loss, transformers' convention (-100 ignored)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        """No key/value cache: `generate` reads the whole sequence at each step."""
        return False

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

