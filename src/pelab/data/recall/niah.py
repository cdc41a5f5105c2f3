"""RULER's needle-in-a-haystack family (Hsieh et al. 2024, section 3.1; NVIDIA/RULER
``scripts/data/synthetic/niah.py``): needles ``<k><v>`` (a reserved key id, then a reserved value id) in real text,
then the asked keys ``<k1>..<kq>`` and their values.

* **niah_single**: one needle; its value asked (RULER niah_single_2: essay haystack, one key, one value).
* **niah_multikey**: the asked needle and ``ruler.distractor_keys`` needles with other keys (RULER niah_multikey_1:
  4 keys in the essay).
* **niah_multivalue**: ``ruler.values`` needles of one key, every value asked, in context order (RULER
  niah_multivalue: 4 values).
* **niah_multiquery**: ``ruler.queries`` needles with distinct keys, all asked at once; the answer is the asked
  keys' values, right in any order (RULER niah_multiquery: 4 keys, 4 queries).

Placement: the N needles at evenly spaced places of the haystack (item j after ``round(j * H / (N - 1))`` haystack
tokens, as mqar's probes), the first asked needle at place ``round(depth * (N - 1))`` (one needle: after
``round(depth * H)`` tokens), the others in an order drawn per instance (RULER draws each needle's depth at random
from 40 depths); a training row puts them at uniformly random places, as mqar's rows.

Deviations from RULER besides those of `pelab.data.recall.ruler` (single-token keys and values, exact match, real-text
haystack, small lengths): the needle is the key and value ids alone and the question the asked keys alone, as
Zoology's MQAR (RULER: "One of the special magic numbers for {key} is: {value}." and "What are all the special magic
numbers for {keys}?"): with RULER-like text pieces around them (" magic <k><v>." and "\nmagic <k>") a 2-layer model
stayed on the copy plateau (0.25-0.30 in-window after 1,200 steps) where the bare pairs are learned in about 300 steps
(both measured with experiment=recall's recipe; docs/ruler.md); multi-value answers must come in context order (RULER accepts any order); multi-query answers are
scored in any order, as RULER does (greedy decoding, `RecallSample.any_order`), though the training rows teach the
asked order; RULER's default minimums are higher (see
`pelab.data.recall.ruler_options`)."""

from __future__ import annotations

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.ruler import Instance, draw_ids, ruler_key, spread, too_short
from pelab.data.recall.ruler_options import RulerOptions
from pelab.data.recall.spaces import reserved_ids

NIAH_SINGLE, NIAH_MULTIKEY, NIAH_MULTIVALUE, NIAH_MULTIQUERY = (
    "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")


def shape(kind: str, ruler: RulerOptions) -> tuple[int, int, int, str]:
    """(keys in the context, values per key, keys asked, the setting that sets them) of a niah kind."""
    return {
        NIAH_SINGLE: (1, 1, 1, ""),
        NIAH_MULTIKEY: (1 + ruler.distractor_keys, 1, 1, "distractor_keys"),
        NIAH_MULTIVALUE: (1, ruler.values, 1, "values"),
        NIAH_MULTIQUERY: (ruler.queries, 1, ruler.queries, "queries"),
    }[kind]


def niah_vocabulary(kind: str, ruler: RulerOptions) -> dict[str, int]:
    """Reserved ids a niah kind draws: one key per key in the context, one value per needle (all distinct)."""
    keys, values, _, _ = shape(kind, ruler)
    return {"reserved_keys": keys, "reserved_values": keys * values}


def build_niah(pc: Pieces, g: np.random.Generator, hay: np.ndarray, length: int, depth: float, opts: RecallOptions,
               kind: str, train: bool = False) -> Instance:
    """One niah instance of exactly ``length`` tokens over the haystack tokens ``hay`` (its first H are used).
    ``train``: a training row, which asks every key of the context, one question each in random order (niah_multikey;
    the other kinds ask all their keys already), instead of the first one alone."""
    K, V, Q, what = shape(kind, opts.ruler)
    setting = f"{ruler_key(opts)}.{what}={getattr(opts.ruler, what)}" if what else kind
    k_ids, v_ids = reserved_ids(pc)
    keys = draw_ids(k_ids, K, g, "keys", setting)  # key 0..Q-1 are asked, in that order
    values = draw_ids(v_ids, K * V, g, "values", setting).reshape(K, V)
    others = g.permutation(K * V - 1) + 1  # the needles after the first asked one, in the order they are placed
    # the questions: groups of key indices, each asked at once
    questions = [[int(k)] for k in g.permutation(K)] if train and Q == 1 else [list(range(Q))]
    N = K * V  # needles
    H = length - 2 * N - sum(len(q) + len(q) * V for q in questions)
    if H < 0:
        raise too_short(kind + (" (a training row)" if train else ""), length - H, length, setting)

    # needle m = (key m // V, value m % V); needle 0 (the first asked key's first value) at the depth's place
    at = round(float(depth) * (N - 1))
    order = [int(m) for m in others]
    order.insert(at, 0)
    needles = [[int(keys[m // V]), int(values[m // V, m % V])] for m in order]
    ids, starts = spread(hay[:H], needles, depth, g if train else None)
    value_at = {m: starts[j] + 1 for j, m in enumerate(order)}  # needle -> its value's index
    spans = []
    for q in questions:  # each asked key's values in context order, keys in the order asked
        answer_needles = [m for k in q for m in sorted(range(k * V, k * V + V), key=value_at.get)]
        ids += [int(keys[k]) for k in q]
        answer = [ids[value_at[m]] for m in answer_needles]
        spans.append((len(ids), len(ids) + len(answer)))
        ids += answer
    del ids[spans[-1][0]:]  # the last answer is the instance's answer, not its prompt
    first = min(range(questions[-1][0] * V, questions[-1][0] * V + V), key=value_at.get)
    # niah_multiquery is scored in any order, as RULER does: the values in the asked order need a lookup through the
    # previous question token that the 2-layer recipe did not learn in 3,000 steps, while it finds the set
    # (experiments/ruler/README.md); the training rows still teach the asked order
    return Instance(ids, answer, value_at[first], sorted(value_at.values()), len(v_ids) ** len(answer),
                    spans if train else [], any_order=kind == NIAH_MULTIQUERY)
