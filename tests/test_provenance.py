"""pelab.provenance: the commit a run records, in a git checkout and outside one, and the machine.

Moved from tests/test_reliability.py (split by concern).
"""

from __future__ import annotations

import subprocess

import torch

from helpers.runs import ROOT


def test_summary_carries_the_commit_in_a_git_checkout_and_says_so_outside_one(tmp_path, monkeypatch):
    import pelab
    from pelab import provenance

    provenance.code_version.cache_clear()
    here = provenance.code_version()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert here["git"] == head and isinstance(here["dirty"], bool)
    fake = tmp_path / "site-packages" / "pelab"  # an installed copy: no git around it
    fake.mkdir(parents=True)
    monkeypatch.setattr(pelab, "__file__", str(fake / "__init__.py"))
    provenance.code_version.cache_clear()
    try:
        assert provenance.code_version()["git"] == "not a git checkout"
    finally:
        provenance.code_version.cache_clear()
    m = provenance.machine()
    assert m["cpu_count"] >= 1 and m["torch_threads"] >= 1 and m["gpu_count"] == torch.cuda.device_count()
