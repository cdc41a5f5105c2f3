"""Data: corpora -> tokenizer -> memmap token cache -> deterministic windows (LMDataModule).

The DataModule names are loaded lazily, so `import pelab.data.recall` (or corpora, tokenizer)
does not pay for importing Lightning.
"""

from pelab.data.cache import TokenCache, open_cache, resolve_cache_root
from pelab.data.corpora import SPLITS, split_of
from pelab.data.sources import build_corpus
from pelab.data.tokenizer import EOT, ByteTokenizer, HFTokenizer, make_tokenizer

_LAZY = {"LMDataModule", "RecallMixer", "TrainWindows", "fixed_windows"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pelab.data' has no attribute {name!r}")
    if name == "RecallMixer":
        from pelab.data import mixer as module
    elif name in ("TrainWindows", "fixed_windows"):
        from pelab.data import windows as module
    else:
        from pelab.data import datamodule as module
    return getattr(module, name)


__all__ = [
    "EOT",
    "SPLITS",
    "ByteTokenizer",
    "HFTokenizer",
    "LMDataModule",
    "RecallMixer",
    "TokenCache",
    "TrainWindows",
    "build_corpus",
    "fixed_windows",
    "make_tokenizer",
    "open_cache",
    "resolve_cache_root",
    "split_of",
]
