"""Tokenizers, chosen by `tokenizer.kind`:

- `bpe`        byte-level BPE trained with Hugging Face `tokenizers` on the train split (default).
- `byte`       the 256 UTF-8 byte values + `<|endoftext|>` (id 256): 257 ids.
- `pretrained` a hub tokenizer by name (`tokenizer.name=gpt2`); needs the network once, then the
               copy saved in the token cache is used.

All share one small interface: `encode(str) -> list[int]`, `encode_batch(list[str])`,
`decode(list[int]) -> str`, `vocab_size`, `eot_id` (the end-of-document token), `save(path)`.
bpe and byte are lossless: decode(encode(text)) == text for any str (no normalizer, byte-level).

Reserved ids (`tokenizer.reserved_keys` K, `tokenizer.reserved_values` M, default 64 each): appended after
the tokenizer's own vocabulary of V0 ids, keys `reserved_key_ids = range(V0, V0+K)` and values
`reserved_value_ids = range(V0+K, V0+K+M)`; `vocab_size = V0 + K + M`. They are the single-token keys and
values of the synthetic recall tasks (pelab.data.recall). `encode` never returns them (they are ids, not
strings: no text can spell one), so no text token is ever a key or a value; `decode` shows them as
`<k12>` / `<v3>`. They live in this wrapper, not in tokenizer.json: the saved tokenizer is the plain one and
the counts are part of the cache key and meta.json.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pelab.conf_values import with_file_values
from pelab.errors import TokenizerError

EOT = "<|endoftext|>"
TOKENIZER_KINDS = ("bpe", "byte", "pretrained")
_COMMON_EOS = (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")
RESERVED_DEFAULT = 64  # keys and values each: conf/tokenizer/_reserved.yaml


class _Reserved:
    """The reserved key / value ids after the tokenizer's own `base_vocab_size` ids (see the module doc)."""

    base_vocab_size: int

    def _reserve(self, keys: int, values: int) -> None:
        if keys < 0 or values < 0:
            raise TokenizerError(f"tokenizer.reserved_keys={keys} / reserved_values={values} must be >= 0")
        v0 = self.base_vocab_size
        self.reserved_key_ids = range(v0, v0 + keys)
        self.reserved_value_ids = range(v0 + keys, v0 + keys + values)
        self.vocab_size = v0 + keys + values

    @property
    def reserved(self) -> dict[str, list[int]]:
        """The ranges as [start, stop) lists (cache meta.json, summary.json)."""
        k, v = self.reserved_key_ids, self.reserved_value_ids
        return {"keys": [k.start, k.stop], "values": [v.start, v.stop]}

    def decode(self, ids: Iterable[int]) -> str:
        # Text runs through the tokenizer's decoder, reserved ids as <kN> / <vN>.
        out, run = [], []
        for i in ids:
            i = int(i)
            if i < self.base_vocab_size:
                run.append(i)
                continue
            if run:
                out.append(self._decode_text(run))
                run = []
            k0, v0 = self.reserved_key_ids.start, self.reserved_value_ids.start
            out.append(f"<k{i - k0}>" if i < v0 else f"<v{i - v0}>")
        if run:
            out.append(self._decode_text(run))
        return "".join(out)

    def _decode_text(self, ids: list[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(_Reserved):
    """UTF-8 bytes as ids 0..255; EOT = 256; then the reserved ids."""

    kind = "byte"
    base_vocab_size = 257

    def __init__(self, reserved_keys: int = RESERVED_DEFAULT, reserved_values: int = RESERVED_DEFAULT) -> None:
        self.eot_id = 256
        self._reserve(reserved_keys, reserved_values)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # uint8 arrays, not lists: much faster for the cache build, same ints.
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def _decode_text(self, ids: list[int]) -> str:
        # EOT carries no bytes; a window cut mid-character decodes with U+FFFD.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"pelab_tokenizer": "byte", "eot": EOT}))


class HFTokenizer(_Reserved):
    """A `tokenizers.Tokenizer` and its end-of-document id (bpe and pretrained), then the reserved ids."""

    def __init__(
        self, tk: Any, eot_token: str, kind: str,
        reserved_keys: int = RESERVED_DEFAULT, reserved_values: int = RESERVED_DEFAULT,
    ):
        eot_id = tk.token_to_id(eot_token)
        if eot_id is None:
            raise TokenizerError(
                f"the tokenizer has no token {eot_token!r} to separate documents; set tokenizer.eot_token"
            )
        # A literal "<|endoftext|>" inside a document is text, not a document boundary.
        tk.encode_special_tokens = True
        self.tk, self.kind, self.eot_token, self.eot_id = tk, kind, eot_token, int(eot_id)
        # max id + 1, not the count: a hub tokenizer may leave holes in its ids.
        vocab = tk.get_vocab(with_added_tokens=True)
        self.base_vocab_size = max(int(tk.get_vocab_size(with_added_tokens=True)), max(vocab.values()) + 1)
        self._reserve(reserved_keys, reserved_values)

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # Parallel in Rust; the "fast" variant skips offset bookkeeping we never use.
        fn = getattr(self.tk, "encode_batch_fast", self.tk.encode_batch)
        return [e.ids for e in fn(texts, add_special_tokens=False)]

    def _decode_text(self, ids: list[int]) -> str:
        return self.tk.decode(ids, skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        self.tk.save(str(path))


Tokenizer = ByteTokenizer | HFTokenizer


# ----------------------------------------------------------------------------- building


def _cfg_kind(cfg: Mapping[str, Any] | str) -> str:
    if not isinstance(cfg, str) and "kind" not in cfg:
        raise TokenizerError(f"a tokenizer config names its kind in tokenizer.kind; known: {list(TOKENIZER_KINDS)}")
    kind = cfg if isinstance(cfg, str) else str(cfg["kind"])
    if kind not in TOKENIZER_KINDS:
        raise TokenizerError(f"unknown tokenizer.kind={kind!r}; known: {list(TOKENIZER_KINDS)}")
    return kind


def tokenizer_settings(cfg: Mapping[str, Any] | str) -> dict[str, Any]:
    """A tokenizer config (or just its kind) with every key of its kind: the keys it lacks (a config built by hand,
    or recorded before the key existed) take the values conf/tokenizer/<kind>.yaml gives."""
    kind = _cfg_kind(cfg)
    return with_file_values({} if isinstance(cfg, str) else dict(cfg), "tokenizer", kind)


def tokenizer_fingerprint(cfg: Mapping[str, Any] | str) -> dict[str, Any]:
    """The settings that change token ids (part of the token-cache key), the reserved counts included."""
    c = tokenizer_settings(cfg)
    reserved = {k: int(c[k]) for k in ("reserved_keys", "reserved_values")}
    if c["kind"] == "byte":
        return {"kind": "byte", **reserved}
    if c["kind"] == "bpe":
        return {
            "kind": "bpe",
            "vocab_size": int(c["vocab_size"]),
            "min_frequency": int(c["min_frequency"]),
            "train_bytes": c["train_bytes"],
            **reserved,
        }
    fp = {"kind": "pretrained", "name": c["name"], "revision": c["revision"], "eot_token": c["eot_token"], **reserved}
    local = _local_tokenizer_file(fp["name"])
    if local is not None:  # a local file can change under the same name: key on its content
        fp["sha256"] = hashlib.sha256(local.read_bytes()).hexdigest()
    return fp


def train_bpe(
    docs: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2,
    reserved_keys: int = RESERVED_DEFAULT, reserved_values: int = RESERVED_DEFAULT,
) -> HFTokenizer:
    """Byte-level BPE (GPT-2 style pre-tokenization, no normalizer => lossless)."""
    from tokenizers import Tokenizer as _Tk
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + 1:
        raise TokenizerError(f"tokenizer.vocab_size={vocab_size} is too small; byte-level BPE needs > 257")
    tk = _Tk(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tk.train_from_iterator(_batched(docs), trainer)
    return HFTokenizer(tk, EOT, "bpe", reserved_keys, reserved_values)


def _local_tokenizer_file(name: Any) -> Path | None:
    """`tokenizer.name` as a local tokenizer.json (or a folder holding one), else None (a hub name)."""
    if not name or name == "???":
        return None
    path = Path(str(name)).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    return path if path.is_file() else None


def load_pretrained(
    name: str | None, revision: str | None = None, eot_token: str | None = None,
    reserved_keys: int = RESERVED_DEFAULT, reserved_values: int = RESERVED_DEFAULT,
) -> HFTokenizer:
    """A local tokenizer.json (or a folder holding one, e.g. a saved hub tokenizer: offline), else the hub
    repo's tokenizer.json (`hub_tokenizer_file`), as a `tokenizers.Tokenizer` (no transformers needed)."""
    from tokenizers import Tokenizer as _Tk

    if not name or name == "???":
        raise TokenizerError("tokenizer=pretrained needs a hub name: set tokenizer.name=gpt2 (for example)")
    local = _local_tokenizer_file(name)
    path = str(local) if local is not None else hub_tokenizer_file(name, revision)
    try:
        tk = _Tk.from_file(path)
    except Exception as e:  # a tokenizer.json this version of `tokenizers` cannot read
        raise TokenizerError(
            f"tokenizer.name={name!r}: cannot read its tokenizer.json ({type(e).__name__}: {e}); "
            "use another tokenizer.name, tokenizer=bpe or tokenizer=byte"
        ) from e
    return HFTokenizer(tk, eot_token or _guess_eot(tk, name), "pretrained", reserved_keys, reserved_values)


def hub_tokenizer_file(name: str, revision: str | None = None) -> str:
    """Local path of hub repo `name`'s tokenizer.json: from the local Hugging Face cache if it is there, else
    downloaded. Fails fast, in one line, when the hub is unreachable (or HF_HUB_OFFLINE is set) or does not
    know the name: one request with the hub's metadata timeout (HF_HUB_ETAG_TIMEOUT, 10 s) and no retries,
    where `hf_hub_download` alone keeps retrying before giving up (README.md, "Bad inputs")."""
    import huggingface_hub as hub
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError

    where = f"tokenizer.name={name!r}" + (f" (tokenizer.revision={revision!r})" if revision else "")
    offline_fix = "use tokenizer=bpe (trained locally) or tokenizer=byte, or run once with network access"
    try:
        cached = hub.try_to_load_from_cache(name, "tokenizer.json", revision=revision)
    except HFValidationError as e:
        raise TokenizerError(f"{where} is not a Hugging Face hub repo name ({e}); set e.g. tokenizer.name=gpt2") from e
    if isinstance(cached, str):
        return cached
    if hub.constants.is_offline_mode():
        raise TokenizerError(
            f"{where} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; {offline_fix}"
        )
    url = hub.hf_hub_url(name, "tokenizer.json", revision=revision)
    try:
        hub.get_hf_file_metadata(url, timeout=hub.constants.HF_HUB_ETAG_TIMEOUT)
    except HfHubHTTPError as e:  # the hub answered: no such repo / revision / file, or no access
        first = str(e).splitlines()[0]
        raise TokenizerError(
            f"{where} has no tokenizer.json on the Hugging Face hub ({type(e).__name__}: {first}); check the "
            "name (a repo that ships tokenizer.json, e.g. gpt2), or use tokenizer=bpe or tokenizer=byte"
        ) from e
    except Exception as e:  # no answer: offline, DNS, proxy, timeout
        raise TokenizerError(
            f"{where} is not in the local Hugging Face cache and the hub is unreachable "
            f"({type(e).__name__}: {e}); {offline_fix}"
        ) from e
    return hub.hf_hub_download(name, "tokenizer.json", revision=revision)


def _guess_eot(tk: Any, name: str) -> str:
    for t in _COMMON_EOS:
        if tk.token_to_id(t) is not None:
            return t
    raise TokenizerError(f"could not find an end-of-document token in {name!r}; set tokenizer.eot_token")


def load_tokenizer(
    path: str | Path, kind: str, eot_token: str = EOT,
    reserved_keys: int = RESERVED_DEFAULT, reserved_values: int = RESERVED_DEFAULT,
) -> Tokenizer:
    """Reload what `save` wrote (the copy kept in the token cache) with its reserved counts."""
    if kind == "byte":
        return ByteTokenizer(reserved_keys, reserved_values)
    from tokenizers import Tokenizer as _Tk

    return HFTokenizer(_Tk.from_file(str(path)), eot_token, kind, reserved_keys, reserved_values)


def make_tokenizer(cfg: Mapping[str, Any] | str, train_docs: Iterable[str] | None = None) -> Tokenizer:
    """Build a fresh tokenizer from its config (bpe trains on `train_docs`; the caller picks
    them, e.g. `corpus.sample_documents("train", train_bytes)`)."""
    kind = _cfg_kind(cfg)
    fp = tokenizer_fingerprint(cfg)
    reserved = fp["reserved_keys"], fp["reserved_values"]
    if kind == "byte":
        return ByteTokenizer(*reserved)
    if kind == "bpe":
        if train_docs is None:
            raise ValueError("tokenizer=bpe needs training documents")
        return train_bpe(train_docs, fp["vocab_size"], fp["min_frequency"], *reserved)
    return load_pretrained(fp["name"], fp["revision"], fp["eot_token"], *reserved)


def _batched(docs: Iterable[str], n: int = 256) -> Iterable[list[str]]:
    # train_from_iterator parallelises over the items of each batch.
    buf: list[str] = []
    for d in docs:
        buf.append(d)
        if len(buf) == n:
            yield buf
            buf = []
    if buf:
        yield buf
