"""Synthetic recall generators: exact length, gold depth, unique keys, disjoint spaces (issue 6)."""

from __future__ import annotations

import itertools
import json
import random
import re

import numpy as np
import pytest
import torch

from pelab.data.recall import (
    OFFSET_DEPTH,
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
    query = re.search(r'\nKey: "([0-9a-f]+|<k\d+>)" Value: "$', text)
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


# ---- single-token kinds (reserved ids): mqar, mqar_offset, kv_single, passkey_single --------------

FILLER = list(range(32, 127)) * 8  # printable bytes: never a reserved id


def _reserved_only(tok, ids):
    return [t for t in ids if t >= tok.reserved_key_ids.start]


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
            assert _reserved_only(byte_tok, s.input_ids[: s.prefix]) == []  # the prefix is filler text ...
            text = [t for t in s.input_ids if t < 256]  # ... that precedes the window's filler
            assert all((b - a) % 250 == 1 for a, b in itertools.pairwise(text))
    # the gold sits at OFFSET_DEPTH of the window whatever depth is asked
    a = make_probe_samples("mqar_offset", byte_tok, window, 0.0, n=2, seed=2, filler_ids=FILLER)
    b = make_probe_samples("mqar_offset", byte_tok, window, 1.0, n=2, seed=2, filler_ids=FILLER)
    assert [s.input_ids for s in a] == [s.input_ids for s in b] and a[0].depth == OFFSET_DEPTH


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


@pytest.mark.parametrize("tok_name", ["byte_tok", "bpe_tok"])
def test_passkey_single_is_one_reserved_value(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    for depth in DEPTHS:
        for s in make_probe_samples("passkey_single", tok, 200, depth, n=3, seed=8, filler_ids=FILLER):
            (v,) = s.answer_ids
            assert v in tok.reserved_value_ids and s.input_ids.count(v) == 2
            assert _reserved_only(tok, s.input_ids) == [v, v]
            key = tok.decode([v])
            assert f"The pass key is {key}. Remember it. {key} is the pass key." in tok.decode(s.input_ids)
            assert s.input_ids[s.gold_index] == v and s.candidates == [v]
    p0 = make_probe_samples("passkey_single", tok, 200, 0.0, n=3, seed=8)
    p1 = make_probe_samples("passkey_single", tok, 200, 1.0, n=3, seed=8)
    assert [s.answer_ids for s in p0] == [s.answer_ids for s in p1]


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


# ---- mqar training rows --------------------------------------------------------------------------


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
