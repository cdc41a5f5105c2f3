"""The recall factories (pelab.data.recall.factories): clear errors, seeded and paired probe samples,
candidates, training-mix batches of every kind."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from helpers.recall import kv_pairs
from pelab.data.recall import make_probe_samples, make_recall_batch
from pelab.data.tokenizer import ByteTokenizer
from pelab.errors import RecallLengthError


def test_too_short_length_is_a_clear_error(byte_tok):
    with pytest.raises(RecallLengthError):
        make_probe_samples("kv", byte_tok, 20, 0.5, n=1, seed=0)
    with pytest.raises(RecallLengthError):
        make_probe_samples("passkey", byte_tok, 40, 0.5, n=1, seed=0)
    with pytest.raises(ValueError, match="probes.kinds"):
        make_probe_samples("needle", byte_tok, 200, 0.5, n=1, seed=0)
    with pytest.raises(ValueError, match="key_len"):  # 1-hex-char keys: only 8 per space
        make_probe_samples("kv", byte_tok, 400, 0.5, n=1, seed=0, key_len=1)


# ---- seeding: fixed across runs, the same instance at every depth --------------------------------


def test_samples_are_seeded_and_paired_across_depths(byte_tok):
    a = make_probe_samples("kv", byte_tok, 256, 0.0, n=4, seed=11)
    b = make_probe_samples("kv", byte_tok, 256, 0.0, n=4, seed=11)
    c = make_probe_samples("kv", byte_tok, 256, 1.0, n=4, seed=11)
    d = make_probe_samples("kv", byte_tok, 256, 0.0, n=4, seed=12)
    assert [s.input_ids for s in a] == [s.input_ids for s in b]
    assert [s.input_ids for s in a] != [s.input_ids for s in d]
    for s0, s1 in zip(a, c):  # same pairs and answer, only the gold position moved
        assert s0.answer_ids == s1.answer_ids and s0.input_ids != s1.input_ids
        assert sorted(kv_pairs(byte_tok, s0)[0]) == sorted(kv_pairs(byte_tok, s1)[0])
    p0 = make_probe_samples("passkey", byte_tok, 256, 0.0, n=2, seed=11)
    p1 = make_probe_samples("passkey", byte_tok, 256, 1.0, n=2, seed=11)
    assert [s.answer_ids for s in p0] == [s.answer_ids for s in p1]


# ---- the training mix ----------------------------------------------------------------------------


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
def test_recall_batch_shape_mask_and_determinism(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    x, mask = make_recall_batch(tok, 96, 16, rng=random.Random(5), return_mask=True)
    assert x.shape == mask.shape == (16, 97) and x.dtype == torch.long and mask.dtype == torch.bool
    assert torch.equal(x, make_recall_batch(tok, 96, 16, rng=5))  # int seed == Random(seed)
    assert not torch.equal(x, make_recall_batch(tok, 96, 16, rng=6))
    assert int(x.max()) < tok.vocab_size and int(x.min()) >= 0
    for row, m in zip(x.tolist(), mask.tolist()):
        text = tok.decode(row)
        assert m[-1]  # the sequence ends with an answer token
        answers = tok.decode([t for t, on in zip(row, m) if on])
        if "pass key" in text:
            assert re.fullmatch(r" \d{5}", answers)
        else:
            pairs = dict(json.loads(text[text.index("{") : text.index("}") + 1], object_pairs_hook=list))
            queried = re.findall(r'Key: "([0-9a-f]+)" Value: "', text)
            assert answers == "".join(pairs[k] for k in queried)  # every answered value is retrievable


def test_recall_batch_skips_kinds_that_do_not_fit(byte_tok):
    # 63 + 1 tokens: kv fits, the byte-level passkey needle (~100 bytes) does not
    x = make_recall_batch(byte_tok, 63, 6, rng=0)
    assert x.shape == (6, 64)
    assert all("{" in byte_tok.decode(r) for r in x.tolist())
    with pytest.raises(RecallLengthError, match="data.seq_len"):
        make_recall_batch(byte_tok, 16, 2, rng=0)


# ---- candidates, reserved ids --------------------------------------------------------------------


def test_kv_and_passkey_candidates():
    tok = ByteTokenizer()
    for s in make_probe_samples("kv", tok, 200, 0.5, n=2, seed=1):
        pairs, _ = kv_pairs(tok, s)
        assert [tok.decode([c]) for c in s.candidates] == [v[0] for _, v in pairs]
        assert s.candidates[round(0.5 * (len(pairs) - 1))] == s.answer_ids[0]
    s = make_probe_samples("passkey", tok, 200, 0.5, n=1, seed=1)[0]
    assert s.candidates == s.answer_ids[:1] and s.gold_distance == len(s.input_ids) - s.gold_index


def test_single_token_kinds_need_room_and_reserved_ids():
    few = ByteTokenizer(reserved_keys=4, reserved_values=16)
    with pytest.raises(RecallLengthError, match="tokenizer.reserved_keys"):
        make_probe_samples("mqar", few, 100, 0.5, n=1, seed=0, pairs=8)
    with pytest.raises(RecallLengthError, match="probes.pairs"):
        make_probe_samples("mqar", ByteTokenizer(), 17, 0.5, n=1, seed=0, pairs=8)  # needs 2 * 8 + 2
    with pytest.raises(RecallLengthError, match="reserved_values"):
        make_probe_samples("passkey_single", ByteTokenizer(4, 0), 200, 0.5, n=1, seed=0)
    with pytest.raises(RecallLengthError, match="data.recall_pairs"):
        make_recall_batch(ByteTokenizer(), 20, 2, rng=0, kinds=("mqar",), pairs=8)  # needs 4 * 8 tokens


def test_training_mix_of_every_kind_fits_its_row(byte_tok):
    kinds = ("kv", "passkey", "mqar", "kv_single", "passkey_single")
    x, mask = make_recall_batch(byte_tok, 255, 40, rng=1, kinds=kinds, return_mask=True)
    assert x.shape == (40, 256) and int(x.max()) < byte_tok.vocab_size and int(x.min()) >= 0
    seen = set()
    for row, m in zip(x.tolist(), mask.tolist()):
        text, answers = byte_tok.decode(row), [t for t, on in zip(row, m) if on]
        assert m[-1] and answers
        if "Key:" in text:
            seen.add("kv_single" if "<k" in text else "kv")
        elif "pass key" in text:
            seen.add("passkey_single" if "<v" in text else "passkey")
            assert len(answers) == (1 if "<v" in text else 6)
        else:
            seen.add("mqar")
            assert len(answers) == 8 and all(t in byte_tok.reserved_value_ids for t in answers)
    assert seen == set(kinds)
