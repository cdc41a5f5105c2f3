"""pelab.training.config: the list of precisions a config is checked against (written out, so that checking a
config imports no Lightning) is the installed Lightning's own."""

from __future__ import annotations

from typing import Any, get_args

from pelab.training.config import PRECISIONS


def _flat(t: Any) -> tuple:
    args = get_args(t)
    return tuple(a for x in args for a in _flat(x)) if args else (t,)


def test_the_precisions_are_lightnings_own():
    from lightning.fabric.connector import _PRECISION_INPUT

    assert set(PRECISIONS) == {*_flat(_PRECISION_INPUT), "auto"}
