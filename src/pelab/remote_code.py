"""Any PELab model as a `transformers` model with remote code (``trust_remote_code=True``), no `import pelab`.

Only RoPE has a native `transformers` architecture (GPT-NeoX, ``pelab.export``). For every other encoding, layout
and attention, the export carries the code that trained the model: the modules the GPT needs (``pelab.model``,
the encodings it uses, ``pelab.score_bias``, the schemas) copied flat into the export folder as ``pelab_<module>.py``,
their ``from pelab.x.y import ...`` lines rewritten to relative imports (``from .pelab_x_y import ...``), which is
what transformers' dynamic-module loader follows and copies (``dynamic_module_utils.get_relative_imports``). So
the exported model is PELab's own forward, not a second implementation that could drift.

What is not copied is the config layer, which is built on Hydra and OmegaConf: the package ``__init__`` modules,
``pelab.conf_values`` (Hydra's ConfigStore) and ``pelab.encodings.config`` (``hydra.utils.instantiate``). Their
names, and any OmegaConf / Hydra name a copied module imports, come from two generated modules:
``pelab_shims.py`` (``MISSING``; ``store_defaults`` as a no-op, there is no ConfigStore to fill; every other name a
stand-in that raises when used) and ``pelab_encodings.py`` (``PositionEncoding``, ``PositionState`` and
``build_encoding``, which builds an encoding from the resolved settings the export recorded, as Hydra's
``instantiate`` did in training). transformers checks that every absolute import of a remote module is installed
(``check_imports``): after the rewrite only torch, transformers and the standard library remain.

tests/test_export_remote.py: for every encoding, a layout and stick-breaking attention, the exported model loaded
by ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)`` in a process where ``pelab``, ``hydra``
and ``omegaconf`` cannot be imported gives PELab's logits.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

from pelab.errors import ConfigError

# Modules of the config layer: not copied, their names come from the generated modules (module docstring).
ENCODINGS_SHIM = "pelab_encodings"
SHIMS = "pelab_shims"
NOT_COPIED = {"pelab": SHIMS, "pelab.conf_values": SHIMS, "pelab.encodings.config": SHIMS, "pelab.model": SHIMS,
              "pelab.encodings": ENCODINGS_SHIM}
FOREIGN = ("omegaconf", "hydra")  # third-party packages of the config layer
ROOTS = ("pelab.model.gpt", "pelab.model.config")  # what modeling_pelab.py imports
TEMPLATE = Path(__file__).parent / "remote" / "modeling_pelab.py"


def flat_name(module: str) -> str:
    """pelab.model.gpt -> pelab_model_gpt (the remote folder is flat: transformers copies files, not packages)."""
    return module.replace(".", "_")


def module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the export cannot find module {module}")
    return Path(spec.origin)


def _imports(tree: ast.AST) -> list[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import)]


def _target_of(node: ast.ImportFrom | ast.Import) -> str | None:
    """The module an import names when it is PELab's or the config layer's (None: torch, stdlib, ...)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
        if any(n.split(".")[0] in ("pelab", *FOREIGN) for n in names):
            raise ConfigError(f"the export rewrites only `from ... import` lines; found `import {names[0]}` "
                              "in a module the model needs")
        return None
    if node.level or not node.module or node.module.split(".")[0] not in ("pelab", *FOREIGN):
        return None
    return node.module


def rewrite(source: str, copied: set[str]) -> tuple[str, dict[str, set[str]]]:
    """`source` with every PELab / OmegaConf / Hydra import made relative: to the copied module's flat file, or
    to a shim. Returns the new source and, per shim, the names imported from it."""
    lines = source.splitlines(keepends=True)
    wanted: dict[str, set[str]] = {}
    edits = []
    for node in _imports(ast.parse(source)):
        module = _target_of(node)
        if module is None:
            continue
        if module in copied:
            target = flat_name(module)
        else:
            target = NOT_COPIED.get(module, SHIMS)
            wanted.setdefault(target, set()).update(a.name for a in node.names)
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
        indent = lines[node.lineno - 1][: node.col_offset]
        edits.append((node.lineno - 1, node.end_lineno, f"{indent}from .{target} import {names}\n"))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines), wanted


def closure(roots: list[str]) -> list[str]:
    """The PELab modules `roots` import, directly or not (function-level imports too), minus the config layer."""
    seen: list[str] = []
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module in NOT_COPIED:
            continue
        seen.append(module)
        for node in _imports(ast.parse(module_path(module).read_text())):
            target = _target_of(node)
            if target and target.startswith("pelab") and target not in NOT_COPIED:
                todo.append(target)
    return sorted(seen)


def shim_source(names: set[str]) -> str:
    """pelab_shims.py: what the copied modules import from the config layer (module docstring)."""
    own = {"MISSING", "store_defaults"}
    stubs = "".join(f'{n} = _Unavailable("{n}")\n' for n in sorted(names - own))
    return f'''"""The config layer of PELab (Hydra, OmegaConf) as an exported model needs it: nothing but the names.
Written by pelab-export (pelab.remote_code)."""

MISSING = "???"  # omegaconf.MISSING: a schema field with no default


def store_defaults(*args, **kwargs):
    """Hydra's ConfigStore registration: an exported model composes no configs."""


class _Unavailable:
    """A name of PELab's config layer that the exported model never uses; using it says so."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{{self._name}} belongs to PELab's config layer (Hydra / OmegaConf), which an exported "
                           "model does not carry; install pelab to use it")

    __getattr__ = __call__


{stubs}'''


def encodings_source(targets: list[str]) -> str:
    """pelab_encodings.py: the package ``pelab.encodings`` as the model uses it, ``build_encoding`` from the
    settings the export recorded (config.json's ``pe`` and ``layer_pes``)."""
    imports = "".join(f"from .{flat_name(t.rsplit('.', 1)[0])} import {t.rsplit('.', 1)[1]}\n" for t in targets)
    table = "".join(f'    "{t}": {t.rsplit(".", 1)[1]},\n' for t in targets)
    return f'''"""pelab.encodings as an exported model uses it: the contract's classes, and build_encoding from recorded
settings instead of Hydra's instantiate. Written by pelab-export (pelab.remote_code)."""

from .pelab_encodings_base import PositionEncoding, PositionState
{imports}
TARGETS = {{
{table}}}
RECORDED = {{}}  # encoding name -> its resolved settings (_target_ included), filled by modeling_pelab.py


def build_encoding(cfg, d_model, n_heads, train_length=None, **overrides):
    """The encoding named `cfg` (or given as resolved settings) at the model's sizes, as
    pelab.encodings.build_encoding built it in training: its class called with the settings as keywords."""
    settings = dict(RECORDED[cfg] if isinstance(cfg, str) else cfg, **overrides)
    cls = TARGETS[settings.pop("_target_")]
    return cls(d_model=int(d_model), n_heads=int(n_heads), **settings)


__all__ = ["PositionEncoding", "PositionState", "build_encoding"]
'''


def remote_files(targets: list[str]) -> dict[str, str]:
    """file name -> source of the remote-code folder for a model whose encodings are the classes `targets`
    (``_target_`` paths): modeling_pelab.py, the copied modules and the two shims."""
    modules = closure([*ROOTS, *(t.rsplit(".", 1)[0] for t in targets)])
    copied = set(modules)
    files: dict[str, str] = {}
    wanted: dict[str, set[str]] = {}
    for module in modules:
        text, names = rewrite(module_path(module).read_text(), copied)
        files[flat_name(module) + ".py"] = text
        for shim, n in names.items():
            wanted.setdefault(shim, set()).update(n)
    unknown = wanted.get(ENCODINGS_SHIM, set()) - {"PositionEncoding", "PositionState", "build_encoding"}
    if unknown:
        raise ConfigError(f"the exported model would need {sorted(unknown)} from pelab.encodings, which the "
                          "export does not provide (pelab.remote_code.encodings_source)")
    files[SHIMS + ".py"] = shim_source(wanted.get(SHIMS, set()))
    files[ENCODINGS_SHIM + ".py"] = encodings_source(sorted(set(targets)))
    files["modeling_pelab.py"] = TEMPLATE.read_text()
    return files


def remote_config(cfg: dict, vocab_size: int, eot_id: int) -> dict:
    """config.json of the remote-code export: the GPT's settings (``gpt``: GPTConfig's fields), the run's encoding
    and every other encoding a layout uses (``pe``, ``layer_pes``: resolved settings, as training built them)."""
    from omegaconf import OmegaConf

    from pelab.encodings import resolve_pe_config
    from pelab.model import GPTConfig

    model = OmegaConf.to_container(OmegaConf.create(cfg["model"]), resolve=True)
    train_length = int(cfg["data"]["seq_len"])
    gpt = GPTConfig.from_settings(model, vocab_size, train_length)
    pe = resolve_pe_config(cfg["pe"], d_model=gpt.d_model, n_heads=gpt.n_heads, train_length=train_length)
    layer_pes = {s.pe: resolve_pe_config(s.pe, d_model=gpt.d_model, n_heads=gpt.n_heads, train_length=train_length)
                 for s in gpt.layer_specs(pe["name"]) if s.pe != pe["name"]}
    return {"model_type": "pelab", "architectures": ["PelabForCausalLM"],
            "auto_map": {"AutoConfig": "modeling_pelab.PelabConfig",
                         "AutoModelForCausalLM": "modeling_pelab.PelabForCausalLM"},
            "gpt": dataclasses.asdict(gpt), "pe": pe, "layer_pes": layer_pes, "vocab_size": vocab_size,
            "tie_word_embeddings": bool(gpt.tie_embeddings), "bos_token_id": eot_id, "eos_token_id": eot_id,
            "max_position_embeddings": train_length}


def write_remote(out: Path, cfg: dict, state: dict[str, Any], vocab_size: int, eot_id: int) -> Path:
    """Write the remote-code export of a run (`cfg`: its resolved config, `state`: the GPT's weights) to `out`:
    config.json, model.safetensors (the GPT's weights under ``gpt.``; a tied head stored once) and the code."""
    from safetensors.torch import save_file

    config = remote_config(cfg, vocab_size, eot_id)
    targets = [config["pe"]["_target_"], *(p["_target_"] for p in config["layer_pes"].values())]
    out.mkdir(parents=True, exist_ok=True)
    for name, text in remote_files(targets).items():
        (out / name).write_text(text)
    weights = {f"gpt.{k}": v.detach().contiguous() for k, v in state.items()}
    if config["tie_word_embeddings"]:  # one tensor on disk; transformers ties the head back (_tied_weights_keys)
        weights.pop("gpt.lm_head.weight")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out
