"""Tokenizers, chosen by `tokenizer.kind`:

- `bpe`        byte-level BPE trained with Hugging Face `tokenizers` on the train split (default).
- `byte`       the 256 UTF-8 byte values + `<|endoftext|>` (id 256): 257 ids.
- `pretrained` a hub tokenizer by name (`tokenizer.name=gpt2`); needs the network once, then the
               copy saved in the token cache is used.

All share one small interface: `encode(str) -> list[int]`, `encode_batch(list[str])`,
`decode(list[int]) -> str`, `vocab_size`, `eot_id` (the end-of-document token), `save(path)`.
bpe and byte are lossless: decode(encode(text)) == text for any str (no normalizer, byte-level).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

EOT = "<|endoftext|>"
KINDS = ("bpe", "byte", "pretrained")
# BPE merges are learned on at most this much of the train split (spread over it): on the stdlib
# corpus 8 MB trains 3x faster than all 30 MB with the same compression on val (3.29 vs 3.35 B/token).
DEFAULT_TRAIN_BYTES = 8_000_000
_COMMON_EOS = (EOT, "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")


class TokenizerError(ValueError):
    """Bad tokenizer settings or an unavailable hub tokenizer."""


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255; EOT = 256."""

    kind = "byte"

    def __init__(self) -> None:
        self.vocab_size = 257
        self.eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # uint8 arrays, not lists: ~50x faster for the cache build, same ints.
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        # Specials carry no bytes; a window cut mid-character decodes with U+FFFD.
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"pelab_tokenizer": "byte", "eot": EOT}))


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus its end-of-document id (used for bpe and pretrained)."""

    def __init__(self, tk: Any, eot_token: str, kind: str):
        eot_id = tk.token_to_id(eot_token)
        if eot_id is None:
            raise TokenizerError(
                f"the tokenizer has no token {eot_token!r} to separate documents; set tokenizer.eot_token"
            )
        # A literal "<|endoftext|>" inside a document is text, not a document boundary.
        tk.encode_special_tokens = True
        self.tk, self.kind, self.eot_token, self.eot_id = tk, kind, eot_token, int(eot_id)
        self.vocab_size = int(tk.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # Parallel in Rust; the "fast" variant skips offset bookkeeping we never use.
        fn = getattr(self.tk, "encode_batch_fast", self.tk.encode_batch)
        return [e.ids for e in fn(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        self.tk.save(str(path))


Tokenizer = ByteTokenizer | HFTokenizer


# ----------------------------------------------------------------------------- building


def _cfg_kind(cfg: Mapping[str, Any] | str) -> str:
    kind = cfg if isinstance(cfg, str) else str(cfg.get("kind", "bpe"))
    if kind not in KINDS:
        raise TokenizerError(f"unknown tokenizer.kind={kind!r}; known: {list(KINDS)}")
    return kind


def tokenizer_fingerprint(cfg: Mapping[str, Any] | str) -> dict[str, Any]:
    """The settings that change token ids (part of the token-cache key)."""
    kind = _cfg_kind(cfg)
    c: Mapping[str, Any] = {} if isinstance(cfg, str) else cfg
    if kind == "byte":
        return {"kind": "byte"}
    if kind == "bpe":
        return {
            "kind": "bpe",
            "vocab_size": int(c.get("vocab_size", 4096)),
            "min_frequency": int(c.get("min_frequency", 2)),
            "train_bytes": c.get("train_bytes", DEFAULT_TRAIN_BYTES),
        }
    return {
        "kind": "pretrained",
        "name": c.get("name"),
        "revision": c.get("revision"),
        "eot_token": c.get("eot_token"),
    }


def train_bpe(docs: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> HFTokenizer:
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
    return HFTokenizer(tk, EOT, "bpe")


def load_pretrained(
    name: str | None, revision: str | None = None, eot_token: str | None = None
) -> HFTokenizer:
    """The hub repo's tokenizer.json (`hub_tokenizer_file`) as a `tokenizers.Tokenizer` (no transformers needed)."""
    from tokenizers import Tokenizer as _Tk

    if not name or name == "???":
        raise TokenizerError("tokenizer=pretrained needs a hub name: set tokenizer.name=gpt2 (for example)")
    path = hub_tokenizer_file(name, revision)
    try:
        tk = _Tk.from_file(path)
    except Exception as e:  # a repo whose tokenizer.json this version of `tokenizers` cannot read
        raise TokenizerError(
            f"tokenizer.name={name!r}: cannot read its tokenizer.json ({type(e).__name__}: {e}); "
            "use another tokenizer.name, tokenizer=bpe or tokenizer=byte"
        ) from e
    return HFTokenizer(tk, eot_token or _guess_eot(tk, name), "pretrained")


def hub_tokenizer_file(name: str, revision: str | None = None) -> str:
    """Local path of hub repo `name`'s tokenizer.json: from the local Hugging Face cache if it is there, else
    downloaded. Fails fast, in one line, when the hub is unreachable (or HF_HUB_OFFLINE is set) or does not
    know the name: one request with the hub's metadata timeout (HF_HUB_ETAG_TIMEOUT, 10 s) and no retries,
    where `hf_hub_download` alone retries for ~25 s before giving up."""
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


def load_tokenizer(path: str | Path, kind: str, eot_token: str = EOT) -> Tokenizer:
    """Reload what `save` wrote (the copy kept in the token cache)."""
    if kind == "byte":
        return ByteTokenizer()
    from tokenizers import Tokenizer as _Tk

    return HFTokenizer(_Tk.from_file(str(path)), eot_token, kind)


def make_tokenizer(cfg: Mapping[str, Any] | str, train_docs: Iterable[str] | None = None) -> Tokenizer:
    """Build a fresh tokenizer from its config (bpe trains on `train_docs`; the caller picks
    them, e.g. `corpus.sample_documents("train", train_bytes)`)."""
    kind = _cfg_kind(cfg)
    fp = tokenizer_fingerprint(cfg)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        if train_docs is None:
            raise ValueError("tokenizer=bpe needs training documents")
        return train_bpe(train_docs, fp["vocab_size"], fp["min_frequency"])
    return load_pretrained(fp["name"], fp["revision"], fp["eot_token"])


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
