"""Generated text corpora for the data tests (test_corpora, test_hf_corpus, test_tokenizer, test_cache, test_windows,
test_mixer, test_datamodule): words with some non-ASCII, odd indents and line ends; a DataModule over such a folder;
a run configuration that trains on one."""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from helpers.runs import FAST, compose

if TYPE_CHECKING:
    from pelab.data import LMDataModule

_WORDS = "the of and to in is was for on that with as by at from an were are which this be or has"
_ODD = "naïve café 日本語 🙂 Ελληνικά def return self None True x1 y_2 (a, b) [0] {k: v} # -> == !="
WORDS = _WORDS.split(" ") + _ODD.split(" ")

BPE_SMALL = {"kind": "bpe", "vocab_size": 320, "min_frequency": 2}


def random_doc(rng: random.Random) -> str:
    """25-60 lines of 3-14 words, random indents, a random line end."""
    lines = []
    for _ in range(rng.randint(25, 60)):
        indent = rng.choice(["", "    ", "\t", "        "])
        lines.append(indent + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))))
    return "\n".join(lines) + rng.choice(["\n", "\r\n", "  \n", ""])


def text_source(path: Path, **kw) -> dict:
    """The `data.source` config of the .txt files below `path`."""
    return {"source": "text_dir", "path": str(path), "glob": "**/*.txt", **kw}


def text_datamodule(text_dir: Path, cache: Path, tokenizer=BPE_SMALL, **kw) -> LMDataModule:
    """A set-up LMDataModule over `text_dir` (32-token windows, batch 4, BPE_SMALL unless told)."""
    from pelab.data import LMDataModule

    # pure text unless a test asks for recall rows (32-token windows fit no kv / passkey row)
    kw = {"seq_len": 32, "batch_size": 4, "seed": 0, "val_windows": 8, "recall_mix": 0.0, **kw}
    dm = LMDataModule(data=text_source(text_dir), tokenizer=tokenizer, cache_dir=str(cache), **kw)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def words_dir(root: Path, n_files: int, n_bytes: int, seed: int = 0) -> Path:
    """`n_files` UTF-8 text files of ~`n_bytes` each (generated words, some non-ASCII)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        text = ""
        while len(text) < n_bytes:
            text += random_doc(rng) + "\n"
        (root / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    return root


def text_dir_config(folder: Path, cache: Path, out: Path, *extra: str):
    """The composed config of a 4-step run (FAST, CSV log, no final evaluation) on the .txt files of `folder`."""
    return compose([*FAST, "data=text_dir", f"data.path={folder}", f"paths.cache_dir={cache}", "logger=csv",
                    "trainer.max_steps=4", "trainer.val_check_interval=4", "evaluate_after_fit=false",
                    *extra], out)
