"""Reading recall samples back (the test_recall_* files)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pelab.data.recall import RecallSample

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
FILLER = list(range(32, 127)) * 8  # printable bytes: never a reserved id


def kv_pairs(tok, s: RecallSample) -> tuple[list[tuple[str, str]], str]:
    """The (key, value) pairs of the JSON context, in order, and the queried key."""
    text = tok.decode(s.input_ids)
    obj = text[text.index("{") : text.rindex("}") + 1]
    pairs = json.loads(obj, object_pairs_hook=list)  # keeps duplicates, if any
    query = re.search(r'\nKey: "([0-9a-f]+|<k\d+>)" Value: "$', text)
    assert query, text[-40:]
    return pairs, query.group(1)


def reserved_only(tok, ids):
    """The ids of `ids` in the tokenizer's reserved (single-token key / value) range."""
    return [t for t in ids if t >= tok.reserved_key_ids.start]
