"""Synthetic recall generators: exact length, gold depth, unique keys, disjoint spaces (issue 6)."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from pelab.data.recall import (
    PASSKEY_FILLER,
    RecallLengthError,
    RecallSample,
    in_space,
    make_probe_samples,
    make_recall_batch,
)
from pelab.data.tokenizer import ByteTokenizer

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.fixture(scope="module")
def byte_tok():
    return ByteTokenizer()


@pytest.fixture(scope="module")
def bpe_tok():
    """A small real byte-level BPE whose merges cut hex strings and punctuation unevenly."""
    from pelab.data.tokenizer import train_bpe

    r = random.Random(0)
    docs = [
        " ".join(f'{{"{r.randrange(4096):03x}": "{r.randrange(65536):04x}"}}' for _ in range(40))
        + f" {PASSKEY_FILLER} The pass key is {r.randrange(10**5)}. What is the pass key?"
        for _ in range(40)
    ]
    return train_bpe(docs, vocab_size=400)


def kv_pairs(tok, s: RecallSample) -> tuple[list[tuple[str, str]], str]:
    """The (key, value) pairs of the JSON context, in order, and the queried key."""
    text = tok.decode(s.input_ids)
    obj = text[text.index("{") : text.rindex("}") + 1]
    pairs = json.loads(obj, object_pairs_hook=list)  # keeps duplicates, if any
    query = re.search(r'\nKey: "([0-9a-f]+)" Value: "$', text)
    assert query, text[-40:]
    return pairs, query.group(1)


# ---- exact length, gold item at the requested depth ----------------------------------------------


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


# ---- disjoint train / probe spaces ---------------------------------------------------------------


def test_spaces_partition_hex_strings_and_passkeys():
    for n in (2, 3):
        strings = [format(i, f"0{n}x") for i in range(16**n)]
        train = {s for s in strings if in_space(s, "train")}
        probe = {s for s in strings if in_space(s, "probe")}
        assert train.isdisjoint(probe) and train | probe == set(strings)
        assert 0.4 < len(train) / len(strings) < 0.6  # both spaces are large
    keys = [str(k) for k in range(10000, 100000)]
    assert not any(in_space(k, "train") and in_space(k, "probe") for k in keys)


def test_training_mix_and_probes_use_disjoint_keys_and_passkeys(byte_tok):
    x = make_recall_batch(byte_tok, 128, 64, rng=0, key_len=3, value_len=3)
    text = "\n".join(byte_tok.decode(r) for r in x.tolist())
    train_keys = set(re.findall(r'"([0-9a-f]{3})": "', text)) | set(re.findall(r'Key: "([0-9a-f]{3})"', text))
    train_values = set(re.findall(r'": "([0-9a-f]{3})"', text))
    train_pass = set(re.findall(r"pass key is (\d{5})", text))
    assert len(train_keys) > 50 and len(train_pass) > 5  # both kinds present
    assert all(in_space(s, "train") for s in train_keys | train_pass)

    probe_keys, probe_values, probe_pass = set(), set(), set()
    for L in (128, 256):
        for d in DEPTHS:
            for s in make_probe_samples("kv", byte_tok, L, d, n=8, seed=1):
                pairs, _ = kv_pairs(byte_tok, s)
                probe_keys |= {k for k, _ in pairs}
                probe_values |= {v for _, v in pairs}
            for s in make_probe_samples("passkey", byte_tok, L, d, n=8, seed=1):
                probe_pass.add(byte_tok.decode(s.answer_ids).strip())
    assert all(in_space(s, "probe") for s in probe_keys | probe_pass)
    assert train_keys.isdisjoint(probe_keys) and train_pass.isdisjoint(probe_pass)
    # values are NOT split: the answer prior is the same in training and probes (see recall.py)
    for values in (train_values, probe_values):
        assert any(in_space(v, "train") for v in values) and any(in_space(v, "probe") for v in values)


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


def test_recall_batch_kv_only_has_several_pairs_at_short_length(byte_tok):
    x = make_recall_batch(byte_tok, 64, 8, rng=0, kinds=("kv",))
    for row in x.tolist():
        text = byte_tok.decode(row)
        n_pairs = len(json.loads(text[text.index("{") : text.index("}") + 1], object_pairs_hook=list))
        assert 2 <= n_pairs <= 8


def test_recall_batch_skips_kinds_that_do_not_fit(byte_tok):
    # 63 + 1 tokens: kv fits, the byte-level passkey needle (~100 bytes) does not
    x = make_recall_batch(byte_tok, 63, 6, rng=0)
    assert x.shape == (6, 64)
    assert all("{" in byte_tok.decode(r) for r in x.tolist())
    with pytest.raises(RecallLengthError, match="data.seq_len"):
        make_recall_batch(byte_tok, 16, 2, rng=0)
