"""The CPUs next to a GPU, for a batch worker pinned to that GPU (:class:`app.batch.gpu_pin.PinGpu`).

On a host with several CPU sockets each GPU hangs off one of them. A worker whose threads run on
the other socket reads and writes its subject's gigabytes (the DWI's pages, the tractogram it
converts and writes) through the link between the sockets, and four workers at once share it.
dask-cuda's ``LocalCUDACluster`` pins each worker to its GPU's CPUs for that reason; this does the
same for the plain ``LocalCluster`` that ``batch --gpus N`` uses without dask-cuda.

Everything comes from Linux's sysfs, without starting CUDA in the worker (its GPU must be chosen
first): the NVIDIA display and 3-D controllers in PCI bus order (the order CUDA numbers them with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, which the worker is given), and each one's ``local_cpulist``.
Where anything is missing (another OS, a container without sysfs, devices named by UUID) the
worker keeps every CPU, as before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

NVIDIA_VENDOR = "0x10de"
#: PCI classes of a GPU: a VGA controller (0x0300xx) or a 3-D controller (0x0302xx, data-centre
#: GPUs); NVSwitch bridges (0x0680xx) are not GPUs.
GPU_CLASSES = ("0x0300", "0x0302")


def parse_cpulist(text: str) -> set[int]:
    """``"0-3,8,10-11"`` (sysfs's list format) as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def nvidia_gpus(sysfs: str | os.PathLike = "/sys") -> list[Path]:
    """The NVIDIA GPUs' PCI device folders, in bus order (CUDA's ``PCI_BUS_ID`` numbering)."""
    root = Path(sysfs) / "bus" / "pci" / "devices"
    found = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except OSError:
        return []
    for device in entries:
        try:
            vendor = (device / "vendor").read_text().strip().lower()
            klass = (device / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
            found.append(device)
    return found


def gpu_cpus(
    devices: Sequence[str], index: int, sysfs: str | os.PathLike = "/sys", allowed: set[int] | None = None
) -> set[int] | None:
    """The CPUs for the worker of ``devices[index]`` (CUDA device numbers, one worker each): its
    GPU's local CPUs that this process may use, shared with the workers whose GPUs hang off the
    same ones (each worker's thread count is already its share, ``cores // N``), as dask-cuda
    pins its workers. None when they cannot be told, and when every worker's GPU has the same
    CPUs: pinning would then only keep the workers off the rest of the host. The worker then
    keeps every CPU."""
    gpus = nvidia_gpus(sysfs)
    if not gpus or not all(str(d).strip().isdigit() for d in devices):
        return None
    numbers = [int(d) for d in devices]
    if any(n >= len(gpus) for n in numbers):
        return None
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)

    def local(n: int) -> frozenset[int]:
        try:
            return frozenset(parse_cpulist((gpus[n] / "local_cpulist").read_text()) & allowed)
        except (OSError, ValueError):
            return frozenset()

    cpus = {n: local(n) for n in set(numbers)}  # each GPU's list read once
    mine = cpus[numbers[index]]
    if not mine or len(set(cpus.values())) < 2:
        return None
    return set(mine)


def pin_process(cpus: set[int]) -> int:
    """Every thread of this process (and those it starts later) onto ``cpus``; how many threads
    were moved (Linux sets affinity per thread, so the worker's threads already running are
    moved one by one)."""
    moved = 0
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
            moved += 1
        except OSError:  # a thread that ended meanwhile
            continue
    return moved
