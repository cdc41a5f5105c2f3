"""Typed config groups and the one validation pass, run before any data, model or training cost.

Every group of the train config except `pe` (each encoding types its own: `pelab.encodings.resolve_pe_config`)
has a dataclass here. `validate(cfg)` first types each group, `OmegaConf.merge(OmegaConf.structured(Schema),
group)` (`pelab.errors.typed`: a wrong type, an unknown key or a missing value is an error naming the full
key), then range-checks the typed values. Every failure is one `ConfigError` line naming the key.

The values (defaults) live in the YAML files under conf/; the schemas hold types only (a field without a
default is required, `???` to OmegaConf), so each default is written once. `data` and `trainer` are typed only
in the keys pelab reads: a corpus has its own keys (path, name, ...) and the Trainer takes any Lightning keyword.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pelab.errors import ConfigError, typed

# How the data loader scores synthetic recall rows (see pelab.data.datamodule).
RECALL_LOSSES = ("all", "answers", "two_means")
# Each reserved range is at most this many ids: every reserved id is an embedding row only recall rows train.
MAX_RESERVED = 1 << 16
FILLERS = ("val", "sentence")  # probes.filler: real validation text or the classic repeated sentence


# -- schemas (types only: the values are in conf/<group>/*.yaml) -----------------------------------
@dataclass
class ModelConfig:
    name: str
    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int | None  # null = 4 * d_model
    dropout: float
    bias: bool
    attn_chunk_size: int
    attn_backend: str  # auto | sdpa | flex
    init: str  # gpt2 | kaiming
    tie_embeddings: bool
    attn_logit_scale: str  # none | log_length


@dataclass
class LoaderConfig:
    """The loader keys every data config composes from conf/data/_loader.yaml."""

    seq_len: int
    batch_size: int
    val_windows: int | None
    val_batch_size: int | None
    recall_mix: float
    recall_kinds: list[str]
    recall_key_len: int
    recall_value_len: int
    recall_loss: str
    recall_pairs: int
    recall_curriculum: Any  # null or [[step, span], ...] (checked below: OmegaConf names nested errors poorly)
    num_workers: int


LOADER_KEYS = tuple(f.name for f in fields(LoaderConfig))


@dataclass
class TokenizerConfig:
    """The keys every tokenizer config has; each kind adds its own (vocab_size, name, ...)."""

    kind: str
    reserved_keys: int
    reserved_values: int


@dataclass
class OptimConfig:
    lr: float
    weight_decay: float
    betas: list[float]
    eps: float
    warmup_steps: int
    min_lr_ratio: float
    grad_clip: float
    nonfinite: str
    max_skips: int
    fused: bool | None  # null = on CUDA only


@dataclass
class TrainerConfig:
    """The Trainer keys pelab relies on; other Lightning Trainer keywords pass through untyped."""

    max_steps: int
    val_check_interval: Any  # an int number of steps (checked below)
    log_every_n_steps: int
    devices: Any  # n, -1 / "auto" (all), or a list of device ids
    num_nodes: int
    precision: Any  # a Lightning precision, or "auto"


@dataclass
class CheckpointConfig:
    """callbacks.checkpoint (pelab.harness.callbacks.RunCheckpoint), in the keys checked here."""

    mode: str
    every_n_steps: int | None


@dataclass
class ThroughputConfig:
    """callbacks.throughput (pelab.harness.callbacks.TokenThroughput)."""

    available_flops: float | None


# `callbacks` holds `_target_` entries (null or false = off; more may be added): pelab's own are typed.
CALLBACKS = {"checkpoint": CheckpointConfig, "throughput": ThroughputConfig}


@dataclass
class DiagnosticsConfig:
    enabled: bool
    windows: int


@dataclass
class EvalConfig:
    lengths: list[float]
    tokens: int
    stride: int | None
    protocols: list[str]
    split: str
    batch_tokens: int
    diagnostics: DiagnosticsConfig


@dataclass
class ProbesConfig:
    enabled: bool
    kinds: list[str]
    depths: list[float]
    lengths: list[float]
    samples: int
    seed: int
    key_len: int
    value_len: int
    filler: str
    pairs: int
    prefix_multiples: list[int]


@dataclass
class DebugConfig:
    inject_nan_at_step: Any  # null, a step, or a list of steps
    emulate_world_size: int | None


@dataclass
class RunConfig:
    """The top-level keys of conf/train.yaml (the groups are typed by their own schemas)."""

    seed: int
    name: str
    tags: list[str]
    notes: str | None
    optimized_metric: str
    ckpt_path: str | None
    compile: bool
    matmul_precision: str
    evaluate_after_fit: bool
    debug: DebugConfig


# Groups typed in the listed keys only (the others are free).
OPEN_GROUPS = ("data", "trainer", "tokenizer")
SCHEMAS = {"model": ModelConfig, "data": LoaderConfig, "tokenizer": TokenizerConfig, "optim": OptimConfig,
           "trainer": TrainerConfig, "eval": EvalConfig, "probes": ProbesConfig}


# -- typing ----------------------------------------------------------------------------------------
def typed_group(schema: type, values: Any, key: str, *, open_keys: bool = False) -> DictConfig:
    """`values` (config group `key`, resolved) typed against `schema` (pelab.errors.typed); a ConfigError
    naming the full key for a wrong type, an unknown key (unless `open_keys`) or a value left `???`."""
    if values == "???":
        raise ConfigError(f"{key} has no value and this config needs one; choose one ({key}=...).")
    if not isinstance(values, dict):
        raise ConfigError(f"{key}={_show(values)} must be a group of settings (conf/{key}/*.yaml).")
    if open_keys:
        known = {f.name for f in fields(schema)}
        values = {k: v for k, v in values.items() if k in known}
    out = typed(schema, values, key)
    missing = sorted(OmegaConf.missing_keys(out))
    if missing:
        name = ".".join(p for p in (key, missing[0]) if p)
        raise ConfigError(f"{name} has no value and this config needs one; set it ({name}=...).")
    return out


def _plain(parent: DictConfig, key: str) -> Any:
    """parent[key] resolved to plain data, `???` kept as is; a broken interpolation names its key."""
    if key not in parent or OmegaConf.is_missing(parent, key):
        return "???"
    try:
        value = parent[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:  # full_key is the absolute key here
        raise ConfigError(f"{err.full_key or key} cannot be resolved: {str(err.msg).splitlines()[0]}.") from err


def _show(value: Any) -> str:
    """A value as it is written on the command line: [kv, bogus], 1.5, null."""
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a typed float prints as given: lr=-1, not -1.0
    return str(value)


def need(ok: bool, key: str, value: Any, rule: str) -> None:
    """One-line error `<key>=<value> <rule>` unless `ok`; `rule` says what the value must be."""
    if not ok:
        raise ConfigError(f"{key}={_show(value)} {rule}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- range checks ----------------------------------------------------------------------------------
def check_model(m: DictConfig) -> None:
    """The model's own range checks (GPTConfig.validate), run before any data; the vocabulary comes from the
    data, so a stand-in size here."""
    from pelab.model import GPTConfig

    sizes = {k: v for k, v in OmegaConf.to_container(m).items() if k != "name"}
    try:
        GPTConfig(vocab_size=1, **sizes).validate()
    except ValueError as err:  # GPTConfig raises plain ValueErrors naming model.<key>
        raise ConfigError(str(err)) from err


def check_loader(d: DictConfig) -> None:
    from pelab.data.recall import TRAIN_KINDS

    need(d.seq_len >= 1, "data.seq_len", d.seq_len, "must be a positive number of tokens.")
    need(d.batch_size >= 1, "data.batch_size", d.batch_size, "must be a positive number of sequences.")
    for k in ("val_windows", "val_batch_size"):
        need(d[k] is None or d[k] >= 1, f"data.{k}", d[k], "must be >= 1 or null.")
    need(0.0 <= d.recall_mix <= 1.0, "data.recall_mix", d.recall_mix, "must be in [0, 1] (0 = pure text).")
    need(len(d.recall_kinds) > 0 and set(d.recall_kinds) <= set(TRAIN_KINDS), "data.recall_kinds", d.recall_kinds,
         f"must be a non-empty list of {_show(TRAIN_KINDS)}.")
    for k in ("recall_key_len", "recall_value_len"):
        need(d[k] >= 1, f"data.{k}", d[k], "must be >= 1 hex chars.")
    need(d.recall_loss in RECALL_LOSSES, "data.recall_loss", d.recall_loss, f"must be one of {_show(RECALL_LOSSES)}.")
    need(d.recall_pairs >= 1, "data.recall_pairs", d.recall_pairs, "must be >= 1 key-value pairs per mqar row.")
    mqar = d.recall_mix > 0 and "mqar" in d.recall_kinds
    # an mqar row holds N pairs and N queries with their answers: 4N tokens
    need(not mqar or 4 * d.recall_pairs <= d.seq_len + 1, "data.recall_pairs", d.recall_pairs,
         f"does not fit: an mqar row needs 4 x pairs tokens and has data.seq_len + 1 = {d.seq_len + 1}; "
         "lower data.recall_pairs or raise data.seq_len.")
    cur = d.recall_curriculum
    ok = cur is None or (OmegaConf.is_list(cur) and len(cur) > 0 and all(
        OmegaConf.is_list(e) and len(e) in (2, 3) and all(_is_int(v) for v in e[:2])
        and (len(e) == 2 or (isinstance(e[2], (int, float)) and 0.0 <= e[2] <= 1.0)) for e in cur))
    need(ok, "data.recall_curriculum", cur, "must be null or a list of [step, span] (or [step, span, share], "
         "share in [0, 1]) entries, e.g. [[0, 32], [200, 64], [400, 128]] or [[0, 32, 0.5], [400, 128, 0.1]].")
    if cur is not None:
        steps = [e[0] for e in cur]
        need(steps[0] >= 0 and all(a < b for a, b in itertools.pairwise(steps)), "data.recall_curriculum", cur,
             "must list steps >= 0 in increasing order.")
        least = 4 * d.recall_pairs if mqar else 1
        need(all(e[1] >= least for e in cur), "data.recall_curriculum", cur,
             f"spans must be >= {least} tokens" + (" (4 x data.recall_pairs for mqar)." if mqar else "."))
    need(d.num_workers >= 0, "data.num_workers", d.num_workers, "must be >= 0.")


def check_tokenizer(t: DictConfig) -> None:
    from pelab.data.tokenizer import KINDS

    need(t.kind in KINDS, "tokenizer.kind", t.kind, f"must be one of {_show(KINDS)}.")
    for k in ("reserved_keys", "reserved_values"):
        need(0 <= t[k] <= MAX_RESERVED, f"tokenizer.{k}", t[k],
             f"must be in [0, {MAX_RESERVED}] (ids appended after the tokenizer's vocabulary; each is an "
             "embedding row that only recall rows train).")


def check_reserved(tok: Any, d: DictConfig, probes: DictConfig | None) -> None:
    """The single-token recall kinds in use (training mix, probes) against the reserved ids: mqar needs N
    distinct keys and values, kv_single / passkey_single at least one. `tok`: the tokenizer config."""
    from pelab.data.recall import SINGLE_KINDS

    uses = []  # (setting naming the kinds, kinds, pairs setting, pairs)
    if d.recall_mix > 0:
        uses.append(("data.recall_kinds", d.recall_kinds, "data.recall_pairs", d.recall_pairs))
    if probes is not None and probes.enabled:
        uses.append(("probes.kinds", probes.kinds, "probes.pairs", probes.pairs))
    for where, kinds, pairs_key, pairs in uses:
        for kind in set(kinds) & set(SINGLE_KINDS):
            n = pairs if kind.startswith("mqar") else 1
            for k in ("reserved_values",) if kind == "passkey_single" else ("reserved_keys", "reserved_values"):
                have = int(tok.get(k, 0))
                need(have >= n, f"tokenizer.{k}", have, f"is too small for {kind} in {where}: "
                     + (f"it needs {n} distinct ids ({pairs_key}={pairs}); raise it or lower {pairs_key}."
                        if n > 1 else "it needs at least one id; raise it."))


def loader_settings(values: dict) -> DictConfig:
    """The loader keys typed and range-checked (what LMDataModule's constructor runs on its arguments)."""
    d = typed_group(LoaderConfig, values, "data")
    check_loader(d)
    return d


def check_optim(o: DictConfig) -> None:
    need(0 < o.lr < math.inf, "optim.lr", o.lr, "must be a finite number > 0.")
    need(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "must be >= 0.")
    need(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas", o.betas,
         "must be two numbers in [0, 1), e.g. [0.9, 0.95].")
    need(o.eps > 0, "optim.eps", o.eps, "must be > 0.")
    need(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, "must be >= 0.")
    need(0.0 <= o.min_lr_ratio <= 1.0, "optim.min_lr_ratio", o.min_lr_ratio, "must be in [0, 1].")
    need(o.grad_clip >= 0, "optim.grad_clip", o.grad_clip, "must be >= 0 (0 = no clipping).")
    need(o.nonfinite in ("stop", "skip"), "optim.nonfinite", o.nonfinite, "must be 'stop' or 'skip'.")
    need(o.max_skips >= 0, "optim.max_skips", o.max_skips, "must be >= 0.")


def lightning_precisions() -> tuple:
    """Every precision the installed Lightning accepts (its own Literal types), plus our "auto"."""
    from typing import get_args

    from lightning.fabric.connector import _PRECISION_INPUT

    def flat(t: Any) -> tuple:
        args = get_args(t)
        return tuple(a for x in args for a in flat(x)) if args else (t,)

    return (*flat(_PRECISION_INPUT), "auto")


def check_trainer(t: DictConfig) -> None:
    need(t.max_steps >= 1, "trainer.max_steps", t.max_steps,
         "must be a positive number of steps (the batch stream is endless: -1 would never stop).")
    need(_is_int(t.val_check_interval) and t.val_check_interval >= 1, "trainer.val_check_interval",
         t.val_check_interval, "must be a positive whole number of steps (the batch stream has no epochs).")
    need(t.log_every_n_steps >= 1, "trainer.log_every_n_steps", t.log_every_n_steps, "must be >= 1.")
    devices = t.devices
    ok = (devices in (-1, "-1", "auto") or (_is_int(devices) and devices >= 1)
          or (OmegaConf.is_list(devices) and len(devices) > 0 and all(_is_int(i) and i >= 0 for i in devices)))
    need(ok, "trainer.devices", devices, "must be a number of devices >= 1, -1 or auto (all), or a list of ids.")
    need(t.num_nodes >= 1, "trainer.num_nodes", t.num_nodes, "must be >= 1.")
    known = lightning_precisions()
    need(t.precision in known, "trainer.precision", t.precision, f"must be one of {_show(known)}.")


def typed_callbacks(cfg: DictConfig) -> dict[str, DictConfig]:
    """pelab's callback entries that are on, typed in the keys checked here (only those are resolved)."""
    group = cfg.get("callbacks") or {}
    out = {}
    for name, schema in CALLBACKS.items():
        if OmegaConf.is_dict(group.get(name)):
            entry = group[name]
            out[name] = typed_group(schema, {f.name: _plain(entry, f.name) for f in fields(schema)},
                                    f"callbacks.{name}")
    return out


def check_callbacks(c: dict[str, DictConfig]) -> None:
    if "checkpoint" in c:
        ck = c["checkpoint"]
        need(ck.mode in ("min", "max"), "callbacks.checkpoint.mode", ck.mode, "must be 'min' or 'max'.")
        need(ck.every_n_steps is None or ck.every_n_steps >= 1, "callbacks.checkpoint.every_n_steps",
             ck.every_n_steps, "must be a positive number of steps or null.")
    if "throughput" in c:
        flops = c["throughput"].available_flops
        need(flops is None or flops > 0, "callbacks.throughput.available_flops", flops, "must be > 0 or null.")


def check_lengths(key: str, lengths: Any, seq_len: int) -> None:
    from pelab.evaluation.extrapolation import resolve_lengths

    try:
        resolve_lengths(list(lengths), seq_len)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{key}={_show(lengths)}: {err}; use positive multiples of data.seq_len "
                          "(<= 64) or token counts (> 64).") from err


def check_eval(e: DictConfig, seq_len: int) -> None:
    from pelab.data.corpora import SPLITS
    from pelab.evaluation.extrapolation import PROTOCOLS

    check_lengths("eval.lengths", e.lengths, seq_len)
    need(e.tokens >= 1, "eval.tokens", e.tokens, "must be a positive number of tokens.")
    need(e.stride is None or e.stride >= 1, "eval.stride", e.stride, "must be >= 1 or null (= data.seq_len).")
    need(len(e.protocols) > 0 and set(e.protocols) <= set(PROTOCOLS), "eval.protocols", e.protocols,
         f"must be a non-empty list of {_show(PROTOCOLS)}.")
    need(e.split in SPLITS, "eval.split", e.split, f"must be one of {_show(SPLITS)}.")
    need(e.batch_tokens >= 1, "eval.batch_tokens", e.batch_tokens, "must be >= 1.")
    need(e.diagnostics.windows >= 1, "eval.diagnostics.windows", e.diagnostics.windows,
         "must be >= 1 window per length.")


def check_probes(p: DictConfig, seq_len: int) -> None:
    from pelab.data.recall import KINDS
    from pelab.evaluation.extrapolation import resolve_lengths

    need(set(p.kinds) <= set(KINDS), "probes.kinds", p.kinds, f"must list kinds of {_show(KINDS)} ([] = no probes).")
    need(len(p.depths) > 0 and all(0.0 <= d <= 1.0 for d in p.depths), "probes.depths", p.depths,
         "must be a non-empty list of depths in [0, 1] (0 = start of the context, 1 = its end).")
    if p.enabled:
        check_lengths("probes.lengths", p.lengths, seq_len)
    need(p.samples >= 1, "probes.samples", p.samples, "must be >= 1 sample per cell.")
    for k in ("key_len", "value_len"):
        need(p[k] >= 1, f"probes.{k}", p[k], "must be >= 1 hex chars.")
    need(p.filler in FILLERS, "probes.filler", p.filler, f"must be one of {_show(FILLERS)}.")
    need(p.pairs >= 1, "probes.pairs", p.pairs, "must be >= 1 key-value pairs per mqar probe.")
    need(len(p.prefix_multiples) > 0 and all(m >= 0 for m in p.prefix_multiples), "probes.prefix_multiples",
         p.prefix_multiples, "must be a non-empty list of whole numbers >= 0 (filler before the window, in "
         "multiples of data.seq_len).")
    if p.enabled and {"mqar", "mqar_offset"} & set(p.kinds):
        # an mqar probe holds N pairs, the query and the answer: 2N + 2 tokens
        shortest = min(resolve_lengths(list(p.lengths), seq_len)) if "mqar" in p.kinds else seq_len
        if "mqar_offset" in p.kinds:
            shortest = min(shortest, seq_len)
        need(2 * p.pairs + 2 <= shortest, "probes.pairs", p.pairs,
             f"does not fit: an mqar probe needs 2 x pairs + 2 tokens and the shortest probe length is {shortest}; "
             "lower probes.pairs or drop the short probes.lengths.")


MATMUL_PRECISIONS = ("highest", "high", "medium")


def check_run(r: DictConfig, batch_size: int) -> None:
    # numpy's SeedSequence and Lightning's seed_everything take 0 .. 2**32-1 (Lightning silently uses 0 outside).
    need(0 <= r.seed < 2**32, "seed", r.seed, "must be in [0, 2**32).")
    need(bool(r.optimized_metric), "optimized_metric", r.optimized_metric, "must name a metric, e.g. val/ppl.")
    need(r.matmul_precision in MATMUL_PRECISIONS, "matmul_precision", r.matmul_precision,
         f"must be one of {', '.join(MATMUL_PRECISIONS)} (torch.set_float32_matmul_precision).")
    nan_at = r.debug.inject_nan_at_step
    steps = list(nan_at) if OmegaConf.is_list(nan_at) else ([] if nan_at is None else [nan_at])
    need(all(_is_int(s) and s >= 0 for s in steps), "debug.inject_nan_at_step", nan_at,
         "must be null, a step or a list of steps.")
    emulate = r.debug.emulate_world_size
    need(emulate is None or (emulate >= 1 and batch_size % emulate == 0), "debug.emulate_world_size", emulate,
         f"must be a positive divisor of data.batch_size={batch_size}.")


EXTEND_KEYS = ("from", "eval_before", "parent")  # `from` is a Python keyword: no dataclass field


def check_extend(cfg: DictConfig) -> None:
    """`extend` (conf/train.yaml): null, or {from: a path or null, eval_before: bool, parent: filled by train.py}."""
    e = _plain(cfg, "extend") if "extend" in cfg else None
    if e in (None, "???"):
        return
    need(isinstance(e, dict), "extend", e, "must be a group of settings (extend.from=<run folder or .ckpt>).")
    unknown = sorted(set(e) - set(EXTEND_KEYS))
    if unknown:
        raise ConfigError(f"extend.{unknown[0]} is not a setting of extend; known: {_show(list(EXTEND_KEYS))}.")
    need(e.get("from") is None or isinstance(e["from"], str), "extend.from", e.get("from"),
         "must be a .ckpt file or a run folder (or null).")
    need(isinstance(e.get("eval_before", False), bool), "extend.eval_before", e.get("eval_before"),
         "must be true or false.")


# -- the pass --------------------------------------------------------------------------------------
def validate(cfg: DictConfig) -> dict[str, DictConfig]:
    """Type and range-check every group of a train config except `pe`; return the typed groups
    ("run" = the top-level keys). Cheap: no data, no model."""
    import pelab.tasks.task  # noqa: F401  registers the resolvers the run name uses (${pelab.sweep_suffix:})

    t = {g: typed_group(s, _plain(cfg, g), g, open_keys=g in OPEN_GROUPS) for g, s in SCHEMAS.items()}
    run_keys = {f.name: _plain(cfg, f.name) for f in fields(RunConfig) if f.name in cfg}
    t["run"] = typed_group(RunConfig, run_keys, "")
    t["callbacks"] = typed_callbacks(cfg)
    check_model(t["model"])
    check_loader(t["data"])
    check_tokenizer(t["tokenizer"])
    check_optim(t["optim"])
    check_trainer(t["trainer"])
    check_callbacks(t["callbacks"])
    check_eval(t["eval"], t["data"].seq_len)
    check_probes(t["probes"], t["data"].seq_len)
    check_reserved(t["tokenizer"], t["data"], t["probes"])
    check_run(t["run"], t["data"].batch_size)
    check_extend(cfg)
    return t
