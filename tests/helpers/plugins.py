"""The source of a probe kind defined outside the package, written to a module by the tests that import it as a
plugin (tests/test_probe_kinds.py, tests/test_plugins.py): the context repeats one of four letters, its own small
vocabulary, and the answer is that letter."""

TOY_KIND = '''
import random

from pelab.data.recall import ProbeKind, RecallSample, register_probe_kind

LETTERS = [ord(c) for c in "abcd"]


def probe(pc, name, length, depth, n, seed, opts):
    out = []
    for i in range(n):
        t = random.Random(f"{seed}/{name}/{length}/{i}").choice(LETTERS)
        out.append(RecallSample([t] * (length - 1), [t], 0, depth, length, name, 1, len(LETTERS), [t], [0.0]))
    return out


register_probe_kind(ProbeKind("repeat_letter", "toy", probe))
'''
