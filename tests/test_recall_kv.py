"""kv and kv_single sequences (pelab.data.recall.kv): exact length, gold depth, unique keys, valid JSON."""

from __future__ import annotations

import json
import re

import pytest

from helpers.recall import DEPTHS, kv_pairs
from pelab.data.recall import make_probe_samples, make_recall_batch


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
@pytest.mark.parametrize("length", [64, 200, 512])
def test_kv_exact_length_gold_depth_and_unique_keys(request, tok_name, length):
    tok = request.getfixturevalue(tok_name)
    for depth in DEPTHS:
        for s in make_probe_samples("kv", tok, length, depth, n=3, seed=7):
            assert len(s.input_ids) + len(s.answer_ids) == s.length == length
            assert s.kind == "kv" and s.depth == depth
            # the gold value sits at gold_index, as the same token ids as the answer (a pure copy)
            assert s.input_ids[s.gold_index : s.gold_index + len(s.answer_ids)] == s.answer_ids
            pairs, qkey = kv_pairs(tok, s)
            keys = [k for k, _ in pairs]
            assert len(keys) == len(set(keys)) == s.n_items  # unique keys
            gold_at = keys.index(qkey)
            assert tok.decode(s.answer_ids) == pairs[gold_at][1]
            assert gold_at == round(depth * (len(pairs) - 1))
            # token index within one pair of depth * (haystack span)
            h0 = s.input_ids.index(tok.encode("{")[0])
            h1 = max(i for i, t in enumerate(s.input_ids) if t == tok.encode("}")[0])
            pair_len = (h1 - h0) / len(pairs)
            assert abs(s.gold_index - (h0 + depth * (h1 - h0))) <= pair_len + 2


def test_recall_batch_kv_only_has_several_pairs_at_short_length(byte_tok):
    x = make_recall_batch(byte_tok, 64, 8, rng=0, kinds=("kv",))
    for row in x.tolist():
        text = byte_tok.decode(row)
        n_pairs = len(json.loads(text[text.index("{") : text.index("}") + 1], object_pairs_hook=list))
        assert 2 <= n_pairs <= 8


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
def test_kv_single_is_json_with_one_token_keys_and_values(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    K, M = tok.reserved_key_ids, tok.reserved_value_ids
    for length in (100, 2000):  # 2000: more room than the 64 reserved keys -> whitespace between pairs
        for depth in DEPTHS:
            for s in make_probe_samples("kv_single", tok, length, depth, n=2, seed=4):
                assert len(s.input_ids) + 1 == length and len(s.answer_ids) == 1 and s.answer_ids[0] in M
                pairs, qkey = kv_pairs(tok, s)  # valid JSON once decoded
                keys, values = [k for k, _ in pairs], [v for _, v in pairs]
                assert len(set(keys)) == len(keys) == s.n_items and len(set(values)) == len(values)
                assert all(re.fullmatch(r"<k\d+>", k) for k in keys) and all(re.fullmatch(r"<v\d+>", v) for v in values)
                assert keys.index(qkey) == round(depth * (len(pairs) - 1))
                assert tok.decode(s.answer_ids) == dict(pairs)[qkey]
                assert s.input_ids[s.gold_index] == s.answer_ids[0]
                assert s.candidates == [t for t in s.input_ids if t in M]
                if length == 2000:  # keys ran out: the pairs still span the context
                    assert s.n_items == len(K)
                    at = [i for i, t in enumerate(s.input_ids) if t in K][:-1]
                    assert at[0] < 0.1 * length and at[-1] > 0.85 * length
