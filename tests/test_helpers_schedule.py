"""The test order (tests/helpers/schedule.py): each xdist worker's first slice starts with its share of the slow
tests, longest first; the rest keep their file order; nothing is lost or repeated."""

from __future__ import annotations

from types import SimpleNamespace

from helpers import schedule


def test_each_workers_first_slice_starts_with_its_share_of_the_slow_tests(monkeypatch):
    monkeypatch.setattr(schedule, "SECONDS", {"a::slow50": 50, "b::slow30": 30, "c::slow25": 25, "d::slow10": 10})
    ids = ["a::quick1", "a::slow50", "b::quick2", "b::slow30", "c::slow25", "c::quick3", "d::slow10", "d::quick4",
           "e::quick5", "e::quick6"]
    items = [SimpleNamespace(nodeid=i) for i in ids]

    out = [i.nodeid for i in schedule.order(items, workers=2)]
    assert sorted(out) == sorted(ids)
    # worksteal hands out 10 // 2 = 5 items, then the other 5: longest first, each to the worker with less so far
    # (50 | 30 + 25, then 10 to the first: 60 | 55), each share followed by the quick tests in file order
    assert out[:5] == ["a::slow50", "d::slow10", "a::quick1", "b::quick2", "c::quick3"]
    assert out[5:] == ["b::slow30", "c::slow25", "d::quick4", "e::quick5", "e::quick6"]
    # one process: the slow tests first, longest first
    assert [i.nodeid for i in schedule.order(items, workers=1)][:4] == ["a::slow50", "b::slow30", "c::slow25",
                                                                       "d::slow10"]

