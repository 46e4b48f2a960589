"""A local cohort cluster's workers share the host's cores: each worker process is given
``cores // workers`` threads for OpenMP/BLAS, numba and the engine's own pools, before it
imports anything (Dask's own default is one BLAS thread per worker whatever the cores)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tractlens.app.batch.engines import THREAD_VARIABLES, cluster_arguments, worker_threads_environ


@pytest.mark.parametrize("workers,cores,per", [(1, 64, 64), (2, 64, 32), (4, 64, 16), (3, 64, 21), (8, 4, 1)])
def test_each_worker_gets_its_share_of_the_cores(workers, cores, per, monkeypatch):
    monkeypatch.delenv("TRACTLENS_THREADS", raising=False)
    env = worker_threads_environ(workers, cores)
    assert env == {name: str(per) for name in THREAD_VARIABLES}
    assert {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "TRACTLENS_THREADS"} <= set(env)


def test_threads_given_to_the_command_go_to_every_worker(monkeypatch):
    monkeypatch.setenv("TRACTLENS_THREADS", "6")
    assert worker_threads_environ(4, 64)["OMP_NUM_THREADS"] == "6"


def _without_dask_cuda(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "dask_cuda" else find_spec(name, *a))  # fmt: skip


def test_gpu_and_cpu_clusters_carry_the_workers_thread_share(monkeypatch):
    monkeypatch.delenv("TRACTLENS_THREADS", raising=False)
    _without_dask_cuda(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("tractlens.app.batch.engines.host_cores", lambda: 64)
    assert cluster_arguments(gpus=4).worker_environ["OMP_NUM_THREADS"] == "16"
    assert cluster_arguments(workers=8).worker_environ["TRACTLENS_THREADS"] == "8"


def test_a_local_cluster_s_workers_start_with_their_share(monkeypatch):
    """A real LocalCluster of two processes: the variables are set in each worker, and the
    engine's thread count follows them."""
    pytest.importorskip("distributed")
    from tractlens.app.batch.engines import connect, host_cores

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TRACTLENS_THREADS", raising=False)
    _without_dask_cuda(monkeypatch)
    client, cluster = connect(None, cluster_arguments(workers=2))

    def seen():
        import os

        from tractlens.gpu.host import host_threads

        return os.environ["OMP_NUM_THREADS"], os.environ["TRACTLENS_THREADS"], host_threads()

    try:
        values = client.run(seen)
    finally:
        client.close()
        cluster.close()
    per = str(max(1, host_cores() // 2))
    assert sorted(values.values()) == [(per, per, int(per))] * 2


def test_a_step_result_names_its_worker():
    from tractlens.app.batch.task import worker_identity

    me = worker_identity()
    assert set(me) == {"pid", "gpu", "threads", "cpus", "host"} and me["pid"] > 0
    assert me["cpus"] == len(os.sched_getaffinity(0))
