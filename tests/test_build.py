"""pelab.runs.threads: the thread count a run takes (threads=auto from the free cores, a number, OMP_NUM_THREADS, a
resumed run's own) and the busy-core reading it rests on; pelab.runs.build: the world size of a trainer config."""

from __future__ import annotations


def test_threads_auto_takes_the_free_cores_and_a_number_wins(monkeypatch):
    import os

    import torch

    from pelab.runs import threads

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(threads, "busy_cores", lambda: (2.6, "2.6 cores busy"))
    try:
        assert threads.set_threads("auto", None, 1)["used"] == 5 == torch.get_num_threads()  # 8 cores, ~3 busy
        assert threads.set_threads("auto", None, 2)["used"] == 2  # shared by two processes
        monkeypatch.setattr(threads, "busy_cores", lambda: (11.0, "11 cores busy"))
        assert threads.set_threads("auto", None, 1)["used"] == 1  # never 0
        assert threads.set_threads(3, None, 1) == {"used": 3, "chosen_by": "threads=3"}
        assert threads.set_threads(3, {"used": 2, "chosen_by": "threads=2"}, 1)["used"] == 2  # a resumed run keeps its own
        monkeypatch.setenv("OMP_NUM_THREADS", "4")
        assert threads.set_threads("auto", None, 1) == {"used": 4, "chosen_by": "OMP_NUM_THREADS"}
    finally:
        torch.set_num_threads(before)


def test_busy_cores_sees_a_busy_process():
    """A real process spinning on one core is seen (whatever else the machine runs, at least that core is busy)."""
    import os
    import subprocess
    import sys

    from pelab.runs.threads import busy_cores

    spin = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                            stdout=subprocess.PIPE, text=True)
    try:
        # it spins from here on (a fixed sleep could end before a loaded machine had even started it)
        assert spin.stdout.readline() == "spinning\n"
        busy, how = busy_cores(1.0)
    finally:
        spin.kill()
        spin.wait()
    assert 0.6 <= busy <= os.cpu_count() + 0.01 and "cores busy" in how, busy


def test_world_size_counts_devices_times_nodes():
    import torch
    from omegaconf import OmegaConf

    from helpers.runs import compose
    from pelab.runs.build import world_size_of

    default = compose([]).trainer  # conf/trainer/auto.yaml: one device, one node
    trainer = lambda **keys: OmegaConf.merge(default, keys)
    assert world_size_of(default) == 1
    assert world_size_of(trainer(devices=2)) == world_size_of(trainer(devices="2")) == 2
    assert world_size_of(trainer(devices=[0, 3])) == 2  # a list of device ids
    assert world_size_of(trainer(devices=4, num_nodes=2)) == 8
    assert world_size_of(trainer(devices="auto", accelerator="cpu")) == world_size_of(
        trainer(devices=-1, accelerator="cpu")) == 1
    assert world_size_of(trainer(devices=-1, accelerator="gpu")) == max(1, torch.cuda.device_count())
    assert world_size_of(compose(["trainer=ddp_sim"]).trainer) == 2  # the two-rank CPU config of conf/trainer/
    assert world_size_of(compose(["trainer=cpu"]).trainer) == 1
