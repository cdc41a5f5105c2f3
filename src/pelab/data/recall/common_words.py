"""RULER's common-words extraction, ``cwe`` (Hsieh et al. 2024, section 3.3 "aggregation"; NVIDIA/RULER
``scripts/data/synthetic/common_words_extraction.py``): a shuffled list of ``ruler.words`` distinct words, some far
more frequent than the others, then ``"\\nTop:"``; the answer is the ``ruler.common`` most frequent words,
most frequent first.

Frequencies: the word of rank i (i = 0 .. common - 1) appears ``(common + 1 - i) x u`` times, every other word u
times, u = the list's room divided by the weights' sum (at least 1; the remainder is one-token padding before the
list). So the counts grow with the length and the ranks stay one step of u apart: 4u, 3u, 2u and u with 3 common
words.

Deviations from RULER besides those of `pelab.data.recall.ruler` (single-token words, exact match, small lengths):
words are reserved value ids (RULER: English words); the number of distinct words is fixed and their repeats grow
with the length (RULER fixes the repeats, 30 common and 3 uncommon, and adds uncommon words as the length grows);
the common words have distinct frequencies and must come most frequent first, because a teacher-forced answer needs
one order (RULER's 10 common words are equally frequent and scored in any order); no numbering ("1. word") and no
few-shot example, and a short question ("\\nTop:"; RULER: "What are the 10 most common words in the above list?");
no haystack, as in RULER, and no depth (the instance is the same at every probed depth: read cwe by
length)."""

from __future__ import annotations

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.ruler import Instance, draw_ids, ruler_key, too_short
from pelab.data.recall.ruler_options import RulerOptions
from pelab.data.recall.spaces import reserved_ids

CWE = "cwe"
QUERY = "\nTop:"


def cwe_vocabulary(ruler: RulerOptions) -> dict[str, int]:
    """Reserved ids cwe draws: one value id per distinct word."""
    return {"reserved_values": ruler.words}


def word_weights(words: int, common: int) -> np.ndarray:
    """(words,) the repeats of each word in units of u: common + 1 - i for rank i < common, 1 for the others."""
    return np.array([common + 1 - i for i in range(common)] + [1] * (words - common), dtype=np.int64)


def build_cwe(pc: Pieces, g: np.random.Generator, hay: np.ndarray, length: int, depth: float, opts: RecallOptions,
              kind: str = CWE, train: bool = False) -> Instance:
    """One cwe instance of exactly ``length`` tokens (``hay`` and ``depth`` are not used: see the module doc; a
    training row, ``train``, asks the same one question)."""
    D, c = opts.ruler.words, opts.ruler.common
    setting = f"{ruler_key(opts)}.words={D}, common={c}"
    _, v_ids = reserved_ids(pc)
    words = draw_ids(v_ids, D, g, "values", setting)  # words[i]: rank i (the first c are the common ones)
    weights = word_weights(D, c)
    query = pc(QUERY)
    room = length - len(query) - c
    u = room // int(weights.sum())
    if u < 1:
        raise too_short(kind, len(query) + c + int(weights.sum()), length, setting)
    listed = np.repeat(words, u * weights)
    g.shuffle(listed)
    lead = room - len(listed)
    ids = [pc.pad] * lead + listed.tolist() + query
    first = {}  # word -> index of its first occurrence
    for j in range(lead, lead + len(listed)):
        first.setdefault(ids[j], j)
    return Instance(ids, [int(w) for w in words[:c]], first[int(words[0])], sorted(first.values()),
                    len(v_ids) ** c)
