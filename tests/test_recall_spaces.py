"""Key spaces (pelab.data.recall.spaces): train and probe keys and passkeys are disjoint, values are not."""

from __future__ import annotations

import re

from helpers.recall import DEPTHS, kv_pairs
from pelab.data.recall import in_space, make_probe_samples, make_recall_batch


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
    # values are NOT split: the answer prior is the same in training and probes (see recall/README.md)
    for values in (train_values, probe_values):
        assert any(in_space(v, "train") for v in values) and any(in_space(v, "probe") for v in values)
