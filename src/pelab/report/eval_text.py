"""The evaluation text of a job: which document each evaluation block came from, and the perplexity intervals
clustered by document (``pelab.evaluation.stats.clustered_ppl_interval``).

A run records the document of each block (``evaluation.extrapolation.block_docs``) when it drew them by
document (``blocks.slots_by_document``). Runs without it record only the per-block NLL; their blocks are a
deterministic function of the split's token count, the block length (the longest evaluated length), the number
of blocks K and ``eval.seed`` (``blocks.uniform_slots``, the draw they were made with), so their documents are
rebuilt from the token cache's document starts when this machine builds the very corpus the run recorded (its
data fingerprint: the stdlib of the same Python, or the same text folder). When it cannot, the interval stays
the run's bootstrap over blocks and its label says why.
"""

from __future__ import annotations

import functools
import json

import numpy as np

from pelab.evaluation.blocks import block_documents, uniform_slots
from pelab.evaluation.stats import ClusteredInterval, clustered_ppl_interval
from pelab.metric_keys import metric_key, parse_key
from pelab.report.discovery import Job
from pelab.summary import as_float

REBUILT = ("stdlib", "text_dir")  # corpora read from this machine's disk; a hub corpus is never fetched here


def block_documents_of(job: Job, cache_dir: str | None = None) -> tuple[np.ndarray | None, str]:
    """(K,) document index of each extrapolation block of ``job`` and ""; or None and why it cannot be had.
    Recorded (``block_docs``) or rebuilt from the recorded draw and this machine's token cache."""
    e = job.extrapolation
    if e.get("block_docs") is not None:
        return np.asarray(e["block_docs"], dtype=np.int64), ""
    if not e.get("block_nll") or not all(e.get(k) is not None for k in ("blocks", "seed", "split", "lengths")):
        return None, "the run records no per-block NLL or no block draw (blocks, seed, split)"
    fp = (job.summary.get("data") or {}).get("fingerprint") or {}
    data, tokenizer = job.setting("data"), job.setting("tokenizer")
    if not fp.get("key") or data is None or tokenizer is None:
        return None, "the run records no data fingerprint or no data / tokenizer config"
    doc_starts, why = split_document_starts(json.dumps(data, sort_keys=True), json.dumps(tokenizer, sort_keys=True),
                                            fp["key"], str(e["split"]), cache_dir)
    if doc_starts is None:
        return None, why
    n, block, k = int(doc_starts[-1]), max(int(L) for L in e["lengths"]), int(e["blocks"])
    if int(e.get("n_tokens", -1)) != k * block:
        return None, f"its {e.get('n_tokens')} scored tokens are not {k} blocks of {block}"
    return block_documents(uniform_slots(n, block, k, int(e["seed"])), block, doc_starts), ""


@functools.lru_cache(maxsize=16)
def split_document_starts(data_json: str, tokenizer_json: str, key: str, split: str,
                          cache_dir: str | None) -> tuple[np.ndarray | None, str]:
    """(n_docs + 1,) document starts of ``split`` of the corpus a run recorded (its cache ``key``), from this
    machine's token cache (built if missing), or None and why: a corpus this machine does not build the same.
    Memoised: the jobs of a study share their corpus."""
    from pelab.data import open_cache
    from pelab.data.cache import cache_key
    from pelab.data.sources import build_corpus, source_kind
    from pelab.data.tokenizer import tokenizer_fingerprint
    from pelab.errors import UserError

    data, tokenizer = json.loads(data_json), json.loads(tokenizer_json)
    if source_kind(data) not in REBUILT:
        return None, f"data.source={source_kind(data)} is not rebuilt by the report (only {', '.join(REBUILT)})"
    try:
        corpus = build_corpus(data)
        if cache_key(corpus.fingerprint(), tokenizer_fingerprint(tokenizer)) != key:
            return None, f"this machine's {source_kind(data)} corpus is not the run's (data fingerprint {key})"
        return np.asarray(open_cache(corpus, tokenizer, cache_dir).offsets(split), dtype=np.int64), ""
    except (UserError, OSError) as err:
        return None, f"its corpus cannot be rebuilt here ({err})"


def clustered_ppl(job: Job, cache_dir: str | None = None) -> dict[int, ClusteredInterval]:
    """{length: (ppl, lo, hi, n_documents, design_effect, label)} of the nonoverlap perplexity, the interval
    clustered by document; where the documents cannot be had, the run's recorded bootstrap over blocks with
    n_documents 0, design effect NaN and a label that says why."""
    return _by_length(job, cache_dir, ratio=False)


def clustered_ratio(job: Job, cache_dir: str | None = None) -> dict[int, ClusteredInterval]:
    """{length: ...} of ppl@L / ppl@train_length (nonoverlap), as ``clustered_ppl``: both recomputed from the same
    resampled documents (paired). The training length itself is left out (the ratio is 1 by definition)."""
    return _by_length(job, cache_dir, ratio=True)


def run_interval(job: Job, metric: str, cache_dir: str | None = None) -> ClusteredInterval | None:
    """The interval of one run's ``metric`` as the report shows it: ``extrap/ppl@L`` and ``extrap/ppl_ratio@L``
    (the main evaluation's nonoverlap cells) clustered by document (``clustered_ppl`` / ``clustered_ratio``, or
    their labelled fallback); None for any other metric, or a length without per-block NLL: its recorded
    interval stands."""
    k = parse_key(metric)
    if k is None or k.family != "extrap" or k.variant or k.bound or k.stat not in ("ppl", "ppl_ratio"):
        return None
    return _by_length(job, cache_dir, ratio=k.stat == "ppl_ratio", only=k.length).get(k.length)


def _by_length(job: Job, cache_dir: str | None, ratio: bool, only: int | None = None) -> dict[int, ClusteredInterval]:
    """{length: interval} over the lengths with per-block NLL (``only``: that length alone)."""
    e = job.extrapolation
    nll = {int(key.split("@")[1]): [as_float(v) for v in values]
           for key, values in (e.get("block_nll") or {}).items() if key.startswith("nonoverlap@")}
    base = nll.get(int(e.get("train_length") or 0)) if ratio else None
    lengths = sorted(L for L in nll if (not ratio or (base is not None and L != int(e["train_length"])))
                     and only in (None, L))
    if not lengths:
        return {}
    docs, why = block_documents_of(job, cache_dir)
    if docs is None:
        return {L: _block_bootstrap(job, L, ratio, why) for L in lengths}
    per_block = int(e["n_tokens"]) // len(docs)
    return {L: clustered_ppl_interval(nll[L], per_block, docs, base_nll=base) for L in lengths}


def _block_bootstrap(job: Job, length: int, ratio: bool, why: str) -> ClusteredInterval:
    """The run's recorded interval (a bootstrap over its blocks), labelled with why it is not clustered."""
    name = "extrap/ppl_ratio" if ratio else "extrap/ppl"
    ppl, lo, hi = (job.metrics.get(metric_key(name, length, bound), float("nan")) for bound in ("", "lo", "hi"))
    blocks = job.extrapolation.get("blocks")
    label = f"95% percentile bootstrap over {blocks} blocks (not clustered by document: {why})"
    return ClusteredInterval(ppl, lo, hi, 0, float("nan"), label)
