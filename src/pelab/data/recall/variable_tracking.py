"""RULER's variable tracking, ``vt`` (Hsieh et al. 2024, section 3.2 "multi-hop tracing"; NVIDIA/RULER
``scripts/data/synthetic/variable_tracking.py``): chains of assignments ``X1 = v``, ``X2 = X1``, ... hidden in real
text, each written ``<X1><v>``, ``<X2><X1>`` (the assigned name, then its value or name), then the asked value
``<v>``; the answer is every name bound to v, in chain order.

``ruler.chains`` chains of ``ruler.hops`` hops each (``hops + 1`` names, the first assigned a value): chain 0 is asked,
the others are distractor chains with their own values and names (RULER's default has one chain: no distractor). The
``chains x (hops + 1)`` statements sit at evenly spaced places of the haystack; chain 0's statements take consecutive
places starting at place ``round(depth * (S - hops - 1))`` (S statements in all), the distractor chains the other
places, interleaved in an order drawn per instance that keeps each chain's own order (RULER's
``shuffle_sublists_heap``; RULER draws the places at random, as a training row does here).

Deviations from RULER besides those of `pelab.data.recall.ruler` (single-token names and values, exact match,
real-text haystack, small lengths): names are reserved key ids and values reserved value ids (RULER: 5 upper-case
letters, 5-digit numbers); a statement is the two ids alone and the question the value alone (RULER: "VAR X2 = VAR X1"
and "Find all variables that are assigned the value {v} in the text above."), as the needles of
`pelab.data.recall.niah` (text pieces around them kept a 2-layer model on the copy plateau there); the answer must
list the names in chain order (RULER: any order); depth places the asked chain (RULER has no depth for vt)."""

from __future__ import annotations

import numpy as np

from pelab.data.recall.kinds import RecallOptions
from pelab.data.recall.pieces import Pieces
from pelab.data.recall.ruler import Instance, draw_ids, ruler_key, spread, too_short
from pelab.data.recall.ruler_options import RulerOptions
from pelab.data.recall.spaces import reserved_ids

VT = "vt"


def vt_vocabulary(ruler: RulerOptions) -> dict[str, int]:
    """Reserved ids vt draws: a name per chain and hop (plus the first), a value per chain (all distinct)."""
    return {"reserved_keys": ruler.chains * (ruler.hops + 1), "reserved_values": ruler.chains}


def build_vt(pc: Pieces, g: np.random.Generator, hay: np.ndarray, length: int, depth: float, opts: RecallOptions,
             kind: str = VT, train: bool = False) -> Instance:
    """One vt instance of exactly ``length`` tokens over the haystack tokens ``hay`` (its first H are used).
    ``train``: a training row, which asks every chain's value, one question each in random order, instead of chain
    0's alone."""
    C, h = opts.ruler.chains, opts.ruler.hops
    setting = f"{ruler_key(opts)}.chains={C}, hops={h}"
    k_ids, v_ids = reserved_ids(pc)
    names = draw_ids(k_ids, C * (h + 1), g, "keys", setting).reshape(C, h + 1)  # names[c, j]: X_{j+1} of chain c
    values = draw_ids(v_ids, C, g, "values", setting)
    distractor_order = g.permutation(np.repeat(np.arange(1, C), h + 1))  # chain of each distractor place, in order
    asked = [int(c) for c in g.permutation(C)] if train else [0]
    S = C * (h + 1)
    H = length - 2 * S - len(asked) * (1 + h + 1)
    if H < 0:
        raise too_short(kind + (" (a training row)" if train else ""), length - H, length, setting)

    def statement(c: int, j: int) -> list[int]:  # chain c's j-th assignment: X_{j+1} = v (j = 0) or X_j
        rhs = int(values[c]) if j == 0 else int(names[c, j - 1])
        return [int(names[c, j]), rhs]

    first = round(float(depth) * (S - h - 1))  # chain 0's first place
    chains = [int(c) for c in distractor_order]
    chains[first:first] = [0] * (h + 1)
    hops = [0] * C  # the next statement of each chain
    items = []
    for c in chains:
        items.append(statement(c, hops[c]))
        hops[c] += 1
    ids, starts = spread(hay[:H], items, depth, g if train else None)
    lhs = starts  # every name's index where it is assigned, in context order
    spans = []
    for c in asked:
        ids += [int(values[c])]
        spans.append((len(ids), len(ids) + h + 1))
        ids += [int(x) for x in names[c]]
    answer = ids[spans[-1][0]:]
    del ids[spans[-1][0]:]  # the last answer is the instance's answer, not its prompt
    gold = lhs[chains.index(asked[-1])]  # the asked chain's first name
    return Instance(ids, answer, gold, lhs, len(k_ids) ** (h + 1), spans if train else [])
