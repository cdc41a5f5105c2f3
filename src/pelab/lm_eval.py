"""A PELab checkpoint as a model of EleutherAI's lm-evaluation-harness (lm-eval 0.4.13: the `lmeval` extra).

lm-eval 0.4.13 registers models with ``@register_model`` and discovers no plugins, so its stock CLI cannot see a
model defined in another package. This module registers ``pelab`` when imported:

    python -m pelab.lm_eval run --model pelab --model_args checkpoint=<run folder or .ckpt> --tasks <tasks>
    import pelab.lm_eval; lm_eval.simple_evaluate(model="pelab", model_args="checkpoint=...", tasks=[...])

``python -m pelab.lm_eval ARGS`` is lm-eval's own CLI with ARGS after this import. The ``lm_eval.models`` entry
point in pyproject.toml is for releases that discover plugins.

Conventions, as lm-eval's ``HFLM``: the prefix token (an empty context; the first rolling window) is the
tokenizer's end-of-document token, the token every document follows in PELab's training stream;
``loglikelihood_rolling`` scores a text in windows of ``max_length`` tokens (default: the training length) with
one token of context (context_len 1), i.e. non-overlapping windows over [EOT] + the text, which is PELab's
``eval.protocols=[nonoverlap]`` (``pelab.evaluation.extrapolation.window_plan``); ``generate_until`` is greedy.
Keyword arguments ``pe.<key>=<value>`` set the encoding's evaluation-time options as ``eval.py`` does, e.g.
``--model_args checkpoint=runs/x,pe.scaling.type=yarn,pe.scaling.factor=4,max_length=512``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from omegaconf import OmegaConf

try:  # the lmeval extra
    import lm_eval.models  # noqa: F401  lm-eval's own models first: its registry imports them only when empty
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as err:
    raise ImportError(f"pelab.lm_eval needs lm-eval: pip install 'pelab[lmeval]' ({err})") from err

from pelab.errors import ConfigError

log = logging.getLogger(__name__)


def load_scoring_model(checkpoint: str | Path, pe_options: dict[str, Any] | None = None,
                       device: str = "cpu") -> tuple[torch.nn.Module, Any, Any]:
    """(model in eval mode, its tokenizer, the run's config with `pe_options` applied) of a checkpoint file or a
    run folder (its newest checkpoint, as `ckpt_path=<folder>`)."""
    from pelab.data.disk import resolve_cache_root
    from pelab.encodings import resolve_pe_config
    from pelab.runs.build import build_datamodule
    from pelab.runs.folder import resolve_ckpt_path
    from pelab.tasks.evaluate import load_model, todays_form
    from pelab.training.checkpoints import load_run_checkpoint

    path = resolve_ckpt_path(str(checkpoint), Path.cwd())
    ckpt = load_run_checkpoint(path, key="checkpoint")
    cfg = OmegaConf.create(todays_form(ckpt["hyper_parameters"]["cfg"]))  # its DataModule is built again
    for key, value in (pe_options or {}).items():
        OmegaConf.update(cfg, key, value, force_add=True)
    train_length = int(cfg.data.seq_len)
    resolve_pe_config(cfg.pe, d_model=cfg.model.d_model, n_heads=cfg.model.n_heads, train_length=train_length)
    cfg.paths.cache_dir = str(resolve_cache_root())  # this machine's token cache, not the training machine's
    datamodule = build_datamodule(cfg, 1)
    datamodule.setup("validate")  # the tokenizer is kept in the token cache (a BPE is trained on the corpus)
    vocab_size = int(ckpt["hyper_parameters"]["vocab_size"])
    if datamodule.vocab_size != vocab_size:
        raise ConfigError(f"checkpoint={checkpoint}: its vocabulary has {vocab_size} ids but the tokenizer rebuilt "
                          f"here gives {datamodule.vocab_size}; the corpus or the tokenizer settings changed.")
    return load_model(cfg, ckpt, vocab_size).to(device), datamodule.tokenizer, cfg


@register_model("pelab")
class PELabLM(TemplateLM):
    """lm-eval's model interface over a PELab checkpoint: log-likelihoods and greedy generation, one sequence per
    forward pass (no padding: PELab's models have no padding mask)."""

    def __init__(self, checkpoint: str, device: str | None = "cpu", max_length: int | None = None,
                 max_gen_toks: int = 256, batch_size: int | str = 1, **options: Any) -> None:
        super().__init__()
        unknown = sorted(k for k in options if not k.startswith("pe.") and k not in ("max_batch_size",))
        if unknown:
            raise ConfigError(f"--model_args {', '.join(unknown)}: the pelab model takes checkpoint=, device=, "
                              "max_length=, max_gen_toks= and pe.<key>= (the encoding's evaluation options).")
        pe_options = {k: _parse(v) for k, v in options.items() if k.startswith("pe.")}
        device = _device(device)
        self.model, self.tokenizer, self.cfg = load_scoring_model(checkpoint, pe_options, device)
        self._device = torch.device(device)
        self._max_length = int(max_length or self.cfg.data.seq_len)
        self.max_gen_toks = int(max_gen_toks)

    # ------------------------------------------------------------------ tokenizer
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eot_id)

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(string)]

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    # ------------------------------------------------------------------ scoring
    @torch.no_grad()
    def _continuation_logprobs(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """Sum of log p(continuation | context) and whether greedy decoding gives it; the input is the last
        `max_length` tokens of context + continuation (minus the last), as HFLM truncates."""
        whole = (context + continuation)[-(self.max_length + 1):]
        x = torch.tensor(whole[:-1], device=self._device)[None]  # (1, T)
        logits = self.model(x)[0, -len(continuation):].float()  # (n, V)
        target = torch.tensor(continuation, device=self._device)
        logprobs = F.log_softmax(logits, dim=-1)  # (n, V)
        total = float(logprobs.gather(1, target[:, None]).double().sum())
        return total, bool((logprobs.argmax(dim=-1) == target).all())

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, **kwargs: Any
                              ) -> list[tuple[float, bool]]:
        out = []
        for cache_key, context, continuation in requests:
            result = self._continuation_logprobs(list(context), list(continuation))
            if cache_key is not None:
                self.cache_hook.add_partial("loglikelihood", cache_key, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (text,) in [req.args for req in requests]:
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            total = sum(ll for ll, _ in self._loglikelihood_tokens([(None, c, t) for c, t in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in [req.args for req in requests]:
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = self.tok_encode(context) or [self.prefix_token_id]
            new: list[int] = []
            for _ in range(int(gen_kwargs.get("max_gen_toks", self.max_gen_toks))):
                x = torch.tensor((tokens + new)[-self.max_length:], device=self._device)[None]  # (1, T)
                nxt = int(self.model(x)[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                new.append(nxt)
                if any(stop in self.tok_decode(new) for stop in until):
                    break
            text = self.tok_decode(new)
            for stop in until:  # the continuation up to the first stop sequence, as HFLM returns it
                text = text.split(stop)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out


def _device(requested: str | None) -> str:
    """The device to score on, as HFLM picks it: lm-eval's CLI asks for cuda:0 unless told otherwise; without
    CUDA that becomes the CPU, said in a warning."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        log.warning("--device %s: CUDA is not available here; scoring on the CPU", requested)
        return "cpu"
    return requested


def _parse(value: Any) -> Any:
    """A --model_args value as a Hydra override reads it ("4" -> 4, "yarn" -> "yarn", "null" -> None)."""
    return yaml.safe_load(value) if isinstance(value, str) else value


def main(argv: list[str] | None = None) -> None:
    """lm-eval's CLI with the `pelab` model registered."""
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *(sys.argv[1:] if argv is None else argv)]
    cli_evaluate()


if __name__ == "__main__":
    main()
