"""``tractlens batch --gpus N`` without dask-cuda: a worker plugin that pins each worker process
of a ``distributed.LocalCluster`` to one GPU (imported only when such a cluster is made)."""

from __future__ import annotations

import os

from distributed.diagnostics.plugin import WorkerPlugin

from .cpu_affinity import gpu_cpus, pin_process

#: ``off`` leaves every worker on all the CPUs (to compare; the default pins each to its GPU's)
AFFINITY_VARIABLE = "TRACTLENS_WORKER_AFFINITY"


class PinGpu(WorkerPlugin):
    """Worker ``i`` of a LocalCluster (named 0 … N−1) sees only GPU ``devices[i % N]``
    (``CUDA_VISIBLE_DEVICES``, set when the plugin is registered: before any task, so before
    CUDA starts in that process), with ``environ`` (NVLink multicast off) set too, and runs on
    that GPU's CPUs where the host says which they are and the workers' GPUs hang off more than
    one socket (:mod:`app.batch.cpu_affinity`)."""

    idempotent = True

    def __init__(self, devices, environ: dict | None = None):
        self.devices = [str(d) for d in devices]
        self.environ = dict(environ or {})

    def setup(self, worker) -> None:
        try:
            index = int(worker.name)
        except (TypeError, ValueError):
            index = sum(map(ord, str(worker.name)))
        os.environ["CUDA_VISIBLE_DEVICES"] = self.devices[index % len(self.devices)]
        os.environ.update(self.environ)
        self.cpus = None
        # CUDA numbers identical GPUs in bus order anyway; asked for, the numbers are sysfs's order
        # too, so the worker can be pinned to its GPU's CPUs (cpu_affinity). A user's own order is kept.
        pin = os.environ.get(AFFINITY_VARIABLE, "gpu").strip().lower() != "off"
        if os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID") == "PCI_BUS_ID" and pin:
            cpus = gpu_cpus(self.devices, index % len(self.devices))
            if cpus:
                pin_process(cpus)
                self.cpus = sorted(cpus)
