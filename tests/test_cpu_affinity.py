"""A batch worker pinned to a GPU runs on that GPU's CPUs (app.batch.cpu_affinity), read from a
sysfs tree: here a made-up one of a two-socket host with four GPUs and an NVSwitch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tractlens.app.batch.cpu_affinity import gpu_cpus, nvidia_gpus, parse_cpulist, pin_process

# (PCI address, vendor, class, local CPUs): listed out of bus order on purpose
DEVICES = [
    ("0000:9a:00.0", "0x10de", "0x030200", "16-31"),  # GPU 2 (socket 1)
    ("0000:18:00.0", "0x10de", "0x030200", "0-15"),  # GPU 0 (socket 0)
    ("0000:05:00.0", "0x10de", "0x068000", "0-15"),  # an NVSwitch: not a GPU
    ("0000:2a:00.0", "0x10de", "0x030200", "0-15"),  # GPU 1 (socket 0)
    ("0000:ab:00.0", "0x10de", "0x030000", "16-31"),  # GPU 3 (socket 1, a VGA controller)
    ("0000:00:1f.0", "0x8086", "0x060100", "0-31"),  # not NVIDIA
]


@pytest.fixture
def sysfs(tmp_path) -> Path:
    for address, vendor, klass, cpus in DEVICES:
        device = tmp_path / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(klass + "\n")
        (device / "local_cpulist").write_text(cpus + "\n")
    return tmp_path


def test_cpu_lists_are_read_as_sysfs_writes_them():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("5") == {5} and parse_cpulist("") == set()


def test_the_gpus_come_in_bus_order_without_the_switch(sysfs):
    assert [p.name for p in nvidia_gpus(sysfs)] == ["0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0", "0000:ab:00.0"]


def test_each_worker_runs_on_its_gpus_socket(sysfs):
    allowed = set(range(32))
    got = [gpu_cpus(["0", "1", "2", "3"], k, sysfs, allowed) for k in range(4)]
    assert got == [set(range(16)), set(range(16)), set(range(16, 32)), set(range(16, 32))]
    assert gpu_cpus(["1", "3"], 1, sysfs, allowed) == set(range(16, 32))


def test_workers_whose_gpus_share_one_socket_keep_the_whole_host(sysfs):
    """Pinned, both would leave the other socket idle."""
    assert gpu_cpus(["0", "1"], 0, sysfs, set(range(32))) is None


def test_only_cpus_this_process_may_use_are_given(sysfs):
    assert gpu_cpus(["2", "0"], 0, sysfs, allowed={1, 2, 20, 21}) == {20, 21}
    assert gpu_cpus(["2", "0"], 0, sysfs, allowed={1, 2}) is None  # none of its GPU's: keep every CPU


@pytest.mark.parametrize("devices", [["GPU-5b1c0e2a"], ["7"]])
def test_a_gpu_it_cannot_place_leaves_the_worker_on_every_cpu(sysfs, devices):
    assert gpu_cpus(devices, 0, sysfs, set(range(32))) is None


def test_without_sysfs_nothing_is_pinned(tmp_path):
    assert nvidia_gpus(tmp_path / "absent") == []
    assert gpu_cpus(["0"], 0, tmp_path / "absent", {0}) is None


def test_pinning_moves_every_thread_of_the_process():
    import threading

    mine = set(os.sched_getaffinity(0))
    one = {min(mine)}
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)
    helper.start()
    try:
        assert pin_process(one) >= 2
        helper_tid = helper.native_id
        assert os.sched_getaffinity(helper_tid) == one and os.sched_getaffinity(0) == one
    finally:
        pin_process(mine)
        stop.set()
        helper.join()
    assert os.sched_getaffinity(0) == mine


def test_the_worker_plugin_sets_the_gpu_the_order_and_keeps_a_users_order(monkeypatch):
    pytest.importorskip("distributed", reason="the cohort extra (installed by the test extra)")
    from tractlens.app.batch.gpu_pin import PinGpu

    class Worker:
        name = 1

    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    plugin = PinGpu(["0", "1"], {"NCCL_NVLS_ENABLE": "0"})
    mine = set(os.sched_getaffinity(0))
    try:
        plugin.setup(Worker())  # on a GPU host this pins the test's own process: undone below
    finally:
        pin_process(mine)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1" and os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    if not nvidia_gpus():  # CI: no GPU here, so nothing to pin to
        assert plugin.cpus is None
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    plugin.setup(Worker())
    assert os.environ["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST" and plugin.cpus is None
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    monkeypatch.setenv("TRACTLENS_WORKER_AFFINITY", "off")  # the comparison's switch
    plugin.setup(Worker())
    assert plugin.cpus is None
