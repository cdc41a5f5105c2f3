"""mqar and mqar_offset (pelab.data.recall.mqar): probe slots, gold depth and candidates, paired instances,
position vs distance, and the training rows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from helpers.recall import DEPTHS, FILLER, reserved_only
from pelab.data.recall import OFFSET_DEPTH, make_probe_samples, make_recall_batch


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
@pytest.mark.parametrize("pairs,length", [(8, 64), (8, 257), (3, 40), (1, 30)])
def test_mqar_probe_slots_gold_depth_and_candidates(request, tok_name, pairs, length):
    tok = request.getfixturevalue(tok_name)
    K, M = tok.reserved_key_ids, tok.reserved_value_ids
    H = length - 2 * pairs - 2
    for depth in DEPTHS:
        for s in make_probe_samples("mqar", tok, length, depth, n=4, seed=5, filler_ids=FILLER, pairs=pairs):
            ids = s.input_ids
            assert len(ids) + 1 == s.length == length and len(s.answer_ids) == 1
            assert (s.n_items, s.answer_space, s.prefix) == (pairs, len(M), 0)
            # the pairs sit at slots s_j = round(j * H / (N - 1)) of the filler: key at s_j + 2j, value next
            slots = [round(j * H / (pairs - 1)) for j in range(pairs)] if pairs > 1 else [round(depth * H)]
            kpos = [sj + 2 * j for j, sj in enumerate(slots)]
            assert [i for i, t in enumerate(ids[:-1]) if t in K] == kpos
            assert [i for i, t in enumerate(ids[:-1]) if t in M] == [p + 1 for p in kpos]
            keys, values = [ids[p] for p in kpos], [ids[p + 1] for p in kpos]
            assert len(set(keys)) == len(set(values)) == pairs  # without replacement
            assert all(t < K.start for i, t in enumerate(ids[:-1]) if i not in kpos and i - 1 not in kpos)
            # gold at slot round(depth * (N - 1)); the query is its key, the answer its value
            g = round(depth * (pairs - 1))
            assert ids[-1] == keys[g] and s.answer_ids == [values[g]] and s.gold_index == kpos[g] + 1
            assert s.gold_distance == len(ids) - s.gold_index
            assert s.candidates == values
            assert s.candidate_depths == [(p + 1) / (len(ids) - 1) for p in kpos]


def test_mqar_probes_are_paired_across_depths_and_stable_in_n(byte_tok):
    by_depth = {d: make_probe_samples("mqar", byte_tok, 100, d, n=5, seed=9, filler_ids=FILLER) for d in DEPTHS}
    more = make_probe_samples("mqar", byte_tok, 100, 0.5, n=8, seed=9, filler_ids=FILLER)
    assert [s.input_ids for s in more[:5]] == [s.input_ids for s in by_depth[0.5]]  # sample i does not depend on n
    for i in range(5):
        row = [by_depth[d][i] for d in DEPTHS]
        pairs = [{(s.input_ids[j - 1], s.input_ids[j]) for j in range(1, len(s.input_ids) - 1)
                  if s.input_ids[j] in byte_tok.reserved_value_ids} for s in row]
        assert all(p == pairs[0] for p in pairs)  # the same N pairs
        filler = [[t for t in s.input_ids if t < 256] for s in row]
        assert all(f == filler[0] for f in filler)  # the same filler, in the same order
        assert len({s.answer_ids[0] for s in row}) == 1  # the same gold
        # distractors keep their relative order: only the gold's slot changes
        others = [[v for v in s.candidates if v != s.answer_ids[0]] for s in row]
        assert all(o == others[0] for o in others)
        assert [s.gold_index for s in row] == sorted(s.gold_index for s in row)
    assert by_depth[0.0][0].input_ids != make_probe_samples("mqar", byte_tok, 100, 0.0, n=1, seed=10,
                                                            filler_ids=FILLER)[0].input_ids


def test_mqar_offset_keeps_the_distance_and_moves_the_position(byte_tok):
    window, filler = 48, list(range(250))  # distinct filler ids: contiguity is visible
    by_m = {m: make_probe_samples("mqar_offset", byte_tok, window, 0.0, n=4, seed=2, filler_ids=filler,
                                  prefix_multiple=m) for m in (0, 1, 3, 7)}
    for m, samples in by_m.items():
        for s, s0 in zip(samples, by_m[0], strict=True):
            assert s.length == (1 + m) * window and s.prefix == m * window
            assert s.input_ids[s.prefix:] == s0.input_ids  # the same window at every prefix (paired)
            assert s.gold_distance == s0.gold_distance  # fixed distance to the query ...
            assert s.gold_index == s0.gold_index + m * window  # ... at a growing absolute position
            assert reserved_only(byte_tok, s.input_ids[: s.prefix]) == []  # the prefix is filler text ...
            text = [t for t in s.input_ids if t < 256]  # ... that precedes the window's filler
            assert all((b - a) % 250 == 1 for a, b in itertools.pairwise(text))
    # the gold sits at OFFSET_DEPTH of the window whatever depth is asked
    a = make_probe_samples("mqar_offset", byte_tok, window, 0.0, n=2, seed=2, filler_ids=FILLER)
    b = make_probe_samples("mqar_offset", byte_tok, window, 1.0, n=2, seed=2, filler_ids=FILLER)
    assert [s.input_ids for s in a] == [s.input_ids for s in b] and a[0].depth == OFFSET_DEPTH


def test_mqar_training_rows_ask_every_key_and_mask_exactly_the_answers(byte_tok):
    K, M = byte_tok.reserved_key_ids, byte_tok.reserved_value_ids
    text = np.random.default_rng(0).integers(32, 127, size=(16, 97))
    for span in (None, 40, 32):
        x, mask = make_recall_batch(byte_tok, 96, 16, rng=3, kinds=("mqar",), pairs=8, return_mask=True,
                                    span=span, text=text)
        assert x.shape == mask.shape == (16, 97)
        S = 97 if span is None else span
        for row, m, t in zip(x.tolist(), mask.tolist(), text.tolist(), strict=True):
            assert row[S:] == t[S:]  # after the span: the row's own text, untouched
            hay, queries = row[: S - 16], row[S - 16 : S]
            pairs = {hay[i]: hay[i + 1] for i in range(len(hay) - 1) if hay[i] in K}
            assert len(pairs) == 8 and set(pairs.values()) <= set(M)
            assert [t for t in hay if t < 256] == t[: S - 32]  # filler: the row's text, in order
            asked = queries[::2]
            assert sorted(asked) == sorted(pairs) and queries[1::2] == [pairs[k] for k in asked]
            assert [i for i, on in enumerate(m) if on] == list(range(S - 15, S, 2))  # exactly the N answers
    a = make_recall_batch(byte_tok, 96, 4, rng=3, kinds=("mqar",), return_mask=True, text=text[:4])
    b = make_recall_batch(byte_tok, 96, 4, rng=3, kinds=("mqar",), return_mask=True, text=text[:4])
    assert all(torch.equal(u, v) for u, v in zip(a, b))
