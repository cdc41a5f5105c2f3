"""The RULER-style kinds (pelab.data.recall: niah_*, vt, cwe), checked as an oracle would: each instance is parsed back
from its tokens with no help from the generator, its answer recomputed the way RULER's reference defines it
(NVIDIA/RULER scripts/data/synthetic/niah.py: every value of every asked key; variable_tracking.py: every name of the chain bound
to the asked value; common_words_extraction.py: the most frequent words) and compared; the difficulty minimums are
counted in the tokens; the config refuses less in one line naming the key and its minimum."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from helpers.runs import compose
from pelab.data.recall import make_probe_samples, make_recall_batch
from pelab.data.recall.ruler_options import MINIMUMS, RulerOptions, check_ruler
from pelab.data.tokenizer import ByteTokenizer
from pelab.errors import ConfigError
from pelab.evaluation.probes import score_samples

TOK = ByteTokenizer()
KEYS, VALUES = TOK.reserved_key_ids, TOK.reserved_value_ids
FILLER = list(b"def f(x):\n    return x + 1  # the haystack is code\n" * 40)
NIAH = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery")
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def samples(kind, length=256, depth=0.5, n=6, **ruler):
    return make_probe_samples(kind, TOK, length, depth, n, 7, filler_ids=FILLER, ruler=ruler or None)


def trailing(ids, ids_range):
    """The length of the run of tokens of `ids_range` that ends `ids`."""
    n = 0
    while n < len(ids) and ids[-1 - n] in ids_range:
        n += 1
    return n


def pairs(context, second):
    """The (first, second, index of second) of every statement of a context: a reserved key directly followed by a
    token of `second`; every reserved id of the context must belong to one."""
    out, i = [], 0
    while i < len(context):
        t = context[i]
        if t in KEYS or t in VALUES:
            assert t in KEYS and i + 1 < len(context) and context[i + 1] in second, "a reserved id outside a statement"
            out.append((t, context[i + 1], i + 1))
            i += 2
        else:
            i += 1
    return out


def parse_niah(prompt):
    """(needles [(key, value, value index)], asked keys) of a niah prompt: the asked keys are the run of reserved keys
    that ends it; before them every reserved key is directly followed by its reserved value (a needle)."""
    q = len(prompt) - trailing(prompt, KEYS)
    return pairs(prompt[:q], VALUES), prompt[q:]


@pytest.mark.parametrize("kind", NIAH)
def test_a_needles_answer_is_every_value_of_every_asked_key_in_order(kind):
    for L in (64, 128, 1000):
        for s in samples(kind, L):
            assert len(s.input_ids) + len(s.answer_ids) == L
            needles, asked = parse_niah(s.input_ids)
            assert asked and all(k in KEYS for k in asked)
            # RULER: answers = [a for i in indices for a in values[i]]; here each key's values in context order
            assert s.answer_ids == [v for k in asked for key, v, _ in needles if key == k]
            assert s.input_ids[s.gold_index] == s.answer_ids[0]
            assert s.candidates == [v for _, v, _ in needles]
            # the haystack is the given text, in order, around the needles
            text = "".join(chr(t) for t in s.input_ids if t < 256)
            assert text in "".join(map(chr, FILLER)) * 3


def test_the_needle_kinds_meet_their_minimum_difficulty():
    for kind, want in [("niah_single", (1, 1, 1)), ("niah_multikey", (4, 1, 1)), ("niah_multivalue", (1, 2, 1)),
                       ("niah_multiquery", (2, 1, 2))]:
        for s in samples(kind):
            needles, asked = parse_niah(s.input_ids)
            keys = Counter(k for k, _, _ in needles)
            assert (len(keys), max(keys.values()), len(asked)) == want, kind
            assert len({v for _, v, _ in needles}) == len(needles)  # a value names one needle
    # more distractors, values, queries when asked
    needles, asked = parse_niah(samples("niah_multikey", distractor_keys=6)[0].input_ids)
    assert len({k for k, _, _ in needles}) == 7 and len(asked) == 1
    needles, asked = parse_niah(samples("niah_multivalue", values=4)[0].input_ids)
    assert [k for k, _, _ in needles] == asked * 4
    assert len(parse_niah(samples("niah_multiquery", queries=3)[0].input_ids)[1]) == 3


def test_a_needle_moves_with_depth_and_nothing_else_does():
    """The paired design: the same needles and haystack at every depth; the asked needle at place round(d (N - 1))."""
    first = None
    for d in DEPTHS:
        s = samples("niah_multikey", depth=d, n=1)[0]
        needles, asked = parse_niah(s.input_ids)
        assert [k for k, _, _ in needles].index(asked[0]) == round(d * 3)
        pairs = sorted((k, v) for k, v, _ in needles)
        first = first or pairs
        assert pairs == first
    single = [samples("niah_single", depth=d, n=1)[0] for d in DEPTHS]
    assert [s.gold_index for s in single] == sorted(s.gold_index for s in single)
    assert single[0].gold_index < 10 and single[-1].gold_distance < 12


# ------------------------------------------------------------------------------------------- variable tracking
def parse_vt(prompt):
    """Statements [(lhs, rhs)] in context order (a reserved key, the assigned name, directly followed by a reserved
    key or value), and the asked value that ends the prompt."""
    assert prompt[-1] in VALUES
    return [(lhs, rhs) for lhs, rhs, _ in pairs(prompt[:-1], range(KEYS.start, VALUES.stop))], prompt[-1]


def bound_to(statements, value):
    """Every name bound to `value`, following the assignments (RULER's answer: the chain's variables)."""
    names, frontier = [], value
    while (nxt := [lhs for lhs, rhs in statements if rhs == frontier]):
        assert len(nxt) == 1
        names.append(nxt[0])
        frontier = nxt[0]
    return names


def chains(statements):
    """The chains as lists of names, each from its value."""
    starts = [(lhs, rhs) for lhs, rhs in statements if rhs in VALUES]
    return [bound_to(statements, value) for _, value in starts]


@pytest.mark.parametrize("ruler", [{}, {"hops": 3, "chains": 3}])
def test_variable_tracking_answers_every_name_bound_to_the_value(ruler):
    hops, n_chains = ruler.get("hops", 2), ruler.get("chains", 2)
    for L in (160, 512):
        for s in samples("vt", L, **ruler):
            assert len(s.input_ids) + len(s.answer_ids) == L
            statements, value = parse_vt(s.input_ids)
            assert value in VALUES and s.answer_ids == bound_to(statements, value)
            found = chains(statements)
            # the minimum: >= 2 hops in every chain, a distractor chain with its own value and names
            assert len(found) == n_chains and all(len(c) == hops + 1 for c in found)
            assert len({n for c in found for n in c}) == n_chains * (hops + 1)
            for c in found:  # each chain in its own order: X_{j+1} = X_j after X_j is assigned
                order = [next(i for i, (lhs, _) in enumerate(statements) if lhs == n) for n in c]
                assert order == sorted(order)
            assert s.input_ids[s.gold_index] == s.answer_ids[0]


def test_variable_tracking_places_the_asked_chain_by_depth():
    firsts = []
    for d in DEPTHS:
        s = samples("vt", depth=d, n=1)[0]
        statements, value = parse_vt(s.input_ids)
        names = bound_to(statements, value)
        at = [i for i, (lhs, _) in enumerate(statements) if lhs in names]
        assert at == list(range(at[0], at[0] + 3)) and at[0] == round(d * (6 - 3))  # consecutive places
        firsts.append(sorted(statements))
    assert all(f == firsts[0] for f in firsts)  # the same statements at every depth


# ------------------------------------------------------------------------------------------- common words
@pytest.mark.parametrize("ruler", [{}, {"words": 16, "common": 5}])
def test_common_words_answers_the_most_frequent_words_most_frequent_first(ruler):
    words, common = ruler.get("words", 10), ruler.get("common", 3)
    for L in (128, 300, 1024):
        for s in samples("cwe", L, **ruler):
            assert len(s.input_ids) + len(s.answer_ids) == L
            listed = [t for t in s.input_ids if t in VALUES]
            counts = Counter(listed).most_common()
            assert len(counts) == words >= 10  # the minimum: >= 10 distinct words
            ranked = [w for w, _ in counts]
            assert s.answer_ids == ranked[:common]
            # one order only: the asked words' counts all differ and exceed every other word's
            c = [n for _, n in counts]
            assert all(a > b for a, b in itertools.pairwise(c[:common + 1]))
            assert s.input_ids[s.gold_index] == s.answer_ids[0]
    same = {tuple(samples("cwe", depth=d, n=1)[0].input_ids) for d in DEPTHS}
    assert len(same) == 1  # no depth: the same instance at every depth


# ------------------------------------------------------------------------------------------- training rows
@pytest.mark.parametrize("kind, questions", [("niah_single", 1), ("niah_multikey", 4), ("niah_multivalue", 1),
                                             ("niah_multiquery", 1), ("vt", 2), ("cwe", 1)])
def test_training_rows_ask_every_question_of_one_instance_over_their_own_text(kind, questions):
    """A training row: one instance over the row's own text, the kind's training questions (every key of a multi-key
    context, every chain of a vt context), each answer marked and recomputed from the context alone."""
    rng = np.random.default_rng(0)
    text = rng.integers(32, 127, size=(6, 161))
    x, m = make_recall_batch(TOK, 160, 6, 3, kinds=[kind], return_mask=True, text=text, span=128)
    x, m = x.numpy(), m.numpy()
    for row, mask, own in zip(x, m, text):
        ids = row.tolist()
        runs = [(a, b) for a, b in zip(*(np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]) == e) for e in (1, -1)))]
        assert len(runs) == questions and runs[-1][1] == 128  # the last answer ends the span
        asked = set()
        first = runs[0][0] - (1 if kind == "vt" else trailing(ids[:runs[0][0]], KEYS))  # where the questions start
        for a, b in runs:
            prompt, answer = ids[:a], ids[a:b]
            if kind == "vt":
                statements, value = parse_vt(ids[:first] + [prompt[-1]])
                assert answer == bound_to(statements, value)
                asked.add(value)
            elif kind == "cwe":
                assert answer == [w for w, _ in Counter(t for t in prompt if t in VALUES).most_common(3)]
            else:
                needles, _ = parse_niah(ids[:first])
                keys = prompt[len(prompt) - trailing(prompt, KEYS):]
                assert answer == [v for k in keys for key, v, _ in needles if key == k]
                asked |= set(keys)
        if kind in ("niah_multikey", "vt"):  # every key / chain of the context asked once
            assert len(asked) == questions
        assert (row[128:] == own[128:]).all()  # the row's own text after the span
        if kind != "cwe":  # the haystack is the row's own text, from its start, in order
            hay = [t for t in ids[:first] if t < 256]
            assert len(hay) > 20 and hay == own[:len(hay)].tolist()


# ------------------------------------------------------------------------------------------- minimum difficulty
@pytest.mark.parametrize("key", sorted(MINIMUMS))
def test_each_difficulty_below_its_minimum_is_refused_in_one_line(key):
    least = MINIMUMS[key][0]
    check_ruler(RulerOptions(), "data.recall_ruler")  # the defaults are the minimums (common: above)
    with pytest.raises(ConfigError) as err:
        check_ruler({**RulerOptions().__dict__, key: least - 1}, "data.recall_ruler")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"data.recall_ruler.{key}={least - 1} ") and f"minimum {least}" in msg


def test_the_config_refuses_less_than_the_minimum_before_any_data(tmp_path):
    """Real Hydra composition and the train command's validation: the probes follow the training rows' settings."""
    from omegaconf import OmegaConf

    from pelab.tasks.config import validate

    overrides = ["data.recall_kinds=[vt]", "probes.kinds=[vt,cwe]"]
    cfg = compose(overrides, tmp_path)
    assert cfg.probes.ruler == cfg.data.recall_ruler and cfg.probes.ruler.hops == MINIMUMS["hops"][0]
    validate(cfg, overrides)
    bad = compose([*overrides, "data.recall_ruler.hops=1"], tmp_path)
    with pytest.raises(ConfigError, match=r"^data\.recall_ruler\.hops=1 is below the minimum 2: [^\n]*$"):
        validate(bad, overrides)
    OmegaConf.update(cfg, "probes.ruler", {**RulerOptions().__dict__, "words": 9}, merge=False)
    with pytest.raises(ConfigError, match=r"^probes\.ruler\.words=9 is below the minimum 10: [^\n]*$"):
        validate(cfg, overrides)


class Scripted(nn.Module):
    """Hand-built logits: after each sample's prompt, all mass on the tokens of its script, one per position, whatever
    the tokens fed after the prompt (teacher-forced or generated); elsewhere flat."""

    def __init__(self, scripts):  # {prompt tuple: answer tokens to emit}
        super().__init__()
        self.scripts = scripts
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, idx, pos=None, start=0):
        out = torch.zeros(*idx.shape, TOK.vocab_size)
        for r, row in enumerate(idx.tolist()):
            prompt = next(p for p in self.scripts if tuple(row[: len(p)]) == p)
            for j, t in enumerate(self.scripts[prompt][: len(row) - len(prompt) + 1]):
                out[r, len(prompt) - 1 + j, t] = 1e4
        return out


@pytest.mark.parametrize(("kind", "script", "error"), [
    ("niah_multiquery", lambda a: a, "ok"),
    ("niah_multiquery", lambda a: a[::-1], "ok"),                     # RULER's scoring: the values in any order
    ("niah_multiquery", lambda a: [a[0]] * len(a), "not_in_context"),  # the same value twice is not the set
    ("niah_multivalue", lambda a: a, "ok"),
    ("niah_multivalue", lambda a: a[::-1], "other_in_context"),       # context order, as stated (docs/ruler.md)
])
def test_multi_query_answers_are_right_in_any_order_and_the_other_kinds_in_theirs(kind, script, error):
    ss = samples(kind, 128, n=8)
    assert all(s.any_order == (kind == "niah_multiquery") for s in ss)
    assert all(len(set(s.answer_ids)) == len(s.answer_ids) > 1 for s in ss)
    model = Scripted({tuple(s.input_ids): script(s.answer_ids) for s in ss})
    records = score_samples(model, ss, batch_size=3)  # greedy decoding batched across samples too
    assert [r.correct for r in records] == [error == "ok"] * len(ss)
    assert [r.error for r in records] == [error] * len(ss)
