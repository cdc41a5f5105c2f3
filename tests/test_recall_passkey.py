"""passkey and passkey_single sequences (pelab.data.recall.passkey): exact length, gold depth, filler."""

from __future__ import annotations

import re

import pytest
import torch

from helpers.recall import DEPTHS, FILLER, reserved_only
from pelab.data.recall import make_probe_samples


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
@pytest.mark.parametrize("length", [120, 300])
def test_passkey_exact_length_and_gold_depth(request, tok_name, length):
    tok = request.getfixturevalue(tok_name)
    prefix = len(tok.encode(" The pass key is"))
    for depth in DEPTHS:
        for s in make_probe_samples("passkey", tok, length, depth, n=2, seed=3):
            assert len(s.input_ids) + len(s.answer_ids) == length
            key = tok.decode(s.answer_ids)
            assert re.fullmatch(r" \d{5}", key)
            assert s.input_ids[s.gold_index : s.gold_index + len(s.answer_ids)] == s.answer_ids
            text = tok.decode(s.input_ids)
            assert f"The pass key is{key}. Remember it.{key} is the pass key." in text
            assert text.endswith("What is the pass key? The pass key is")
            # filler tokens before the needle = round(depth * filler length)
            needle = (
                tok.encode(" The pass key is") + s.answer_ids + tok.encode(". Remember it.") + s.answer_ids
            )
            needle += tok.encode(" is the pass key.")
            h = (
                length
                - len(needle)
                - len(tok.encode(" What is the pass key? The pass key is"))
                - len(s.answer_ids)
            )
            assert s.gold_index - prefix == round(depth * h)


def test_passkey_uses_given_filler_ids(byte_tok):
    filler = byte_tok.encode("Real validation text, no fixed sentence. " * 3)
    s = make_probe_samples("passkey", byte_tok, 200, 0.5, n=1, seed=0, filler_ids=filler)[0]
    text = byte_tok.decode(s.input_ids)
    assert "Real validation text" in text and "The sky is blue" not in text
    as_tensor = make_probe_samples(
        "passkey", byte_tok, 200, 0.5, n=1, seed=0, filler_ids=torch.tensor(filler)
    )[0]
    assert as_tensor.input_ids == s.input_ids  # a LongTensor (e.g. from eval_tokens) works the same
    default = make_probe_samples("passkey", byte_tok, 200, 0.5, n=1, seed=0)[0]
    assert "The grass is green. The sky is blue." in byte_tok.decode(default.input_ids)


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
def test_passkey_single_is_one_reserved_value(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    for depth in DEPTHS:
        for s in make_probe_samples("passkey_single", tok, 200, depth, n=3, seed=8, filler_ids=FILLER):
            (v,) = s.answer_ids
            assert v in tok.reserved_value_ids and s.input_ids.count(v) == 2
            assert reserved_only(tok, s.input_ids) == [v, v]
            key = tok.decode([v])
            assert f"The pass key is {key}. Remember it. {key} is the pass key." in tok.decode(s.input_ids)
            assert s.input_ids[s.gold_index] == v and s.candidates == [v]
    p0 = make_probe_samples("passkey_single", tok, 200, 0.0, n=3, seed=8)
    p1 = make_probe_samples("passkey_single", tok, 200, 1.0, n=3, seed=8)
    assert [s.answer_ids for s in p0] == [s.answer_ids for s in p1]
