"""A device failing in a shared run (gpu.multidevice), on simulated GPUs (NumPy backends named
like GPUs, the code path of real ones): it is named, the run finishes on the others with the
same counts or stops cleanly, and nothing is left running or half-written."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from tractlens.gpu.multidevice import ChunkQueue, DeviceFailure, run_shared, simulated_backends


def test_chunks_cover_everything_once_and_shrink_towards_the_end():
    q = ChunkQueue(1000, 4, largest=100, smallest=5)
    got = []
    while (r := q.take()) is not None:
        got.append(r)
    covered = sorted(i for s, c in got for i in range(s, s + c))
    assert covered == list(range(1000))
    sizes = [c for _, c in got]
    assert max(sizes) == 100 and sizes[-1] < 20 and all(c >= 5 for c in sizes[:-1])


def test_ranges_given_back_come_first_cut_to_the_largest_chunk():
    q = ChunkQueue(10, 1, largest=4)
    first = q.take()
    q.give_back([(100, 9)])
    assert [q.take(), q.take(), q.take()] == [(100, 4), (104, 4), (108, 1)]
    assert q.take() == (first[1], 4)  # then the queue's own chunks again (one part: the largest)


class _Counter:
    """A share that counts which items it saw (a stand-in for a tracker's totals)."""

    def __init__(self, backend, total, fail_after=None):
        self.backend, self.seen, self.fail_after, self.launches = backend, np.zeros(total, np.int64), fail_after, 0

    def launch(self, start, count):
        if self.fail_after is not None and self.launches >= self.fail_after:
            raise MemoryError("injected")
        self.launches += 1
        self.seen[start : start + count] += 1
        time.sleep(0.002)  # every device gets chunks

    def finish(self):
        return self.seen


def _opener(total, failing: dict):
    def open_share(backend, report):
        what = failing.get(backend.device_id)
        if what == "start":
            raise RuntimeError("device lost (injected)")
        return _Counter(backend, total, fail_after=what)

    return open_share


def test_a_device_out_of_memory_is_named_and_the_others_finish_its_share():
    backends = simulated_backends(4)
    run = run_shared(backends, 10_000, _opener(10_000, {2: 1}), largest=500, smallest=50)
    assert sum(run.totals).tolist() == [1] * 10_000  # every item exactly once: the failed share's again
    assert [b.device_id for b in run.backends] == [0, 1, 3]
    assert run.notes == [
        "GPU 2 (simulated on the CPU): out of memory while tracking; its share was done again on the other device(s)"
    ]
    assert run.reports[2].failed.startswith("GPU 2 (simulated on the CPU): out of memory")


def test_a_device_lost_at_start_is_named_with_the_cause():
    run = run_shared(simulated_backends(3), 1000, _opener(1000, {0: "start"}), largest=100)
    assert sum(run.totals).tolist() == [1] * 1000
    assert "GPU 0 (simulated on the CPU): RuntimeError: device lost (injected) while starting" in run.notes[0]


def test_without_keep_going_a_failure_stops_every_device_and_is_raised():
    threads_before = threading.active_count()
    with pytest.raises(DeviceFailure, match=r"^GPU 1 \(simulated on the CPU\): out of memory while tracking$") as err:
        run_shared(simulated_backends(3), 10_000, _opener(10_000, {1: 0}), largest=10, keep_going=False)
    assert isinstance(err.value.__cause__, MemoryError) and err.value.out_of_memory
    assert threading.active_count() == threads_before  # no thread left behind


def test_when_every_device_fails_the_first_failure_is_raised():
    with pytest.raises(DeviceFailure, match="GPU 0"):
        run_shared(simulated_backends(2), 100, _opener(100, {0: 0, 1: 0}), largest=10)


def test_probabilistic_counts_are_exact_when_a_simulated_gpu_fails(monkeypatch):
    """The tracker path (gpu.probabilistic_split) with GPU 1 of 3 out of memory at its first
    chunk: the counts equal one run's to the last count, and the note names the device."""
    from tractlens.gpu import probabilistic_split
    from tractlens.gpu.probabilistic_numpy import track_numpy

    from .test_multidevice import _assert_same, _split_case

    field_, bits, seeds, params = _split_case()
    whole = track_numpy(field_, bits, seeds, params, 1, 1, seed_matrix=True)
    launch = probabilistic_split._NumpyShare.launch

    def failing(self, start, count):
        if self.backend.device_id == 1:
            raise MemoryError("injected")
        return launch(self, start, count)

    monkeypatch.setattr(probabilistic_split._NumpyShare, "launch", failing)
    split = probabilistic_split.track_split(field_, bits, seeds, params, simulated_backends(3), n_targets=1,
                                            n_waypoints=1, seed_matrix=True, batch_streamlines=40)  # fmt: skip
    _assert_same(split, whole)
    assert split.provenance["notes"][0].startswith("GPU 1 (simulated on the CPU): out of memory while tracking")
    assert split.provenance["devices"][1]["failed"]


def test_a_failed_shared_run_writes_no_output(tmp_path, monkeypatch, capsys, demo_bedpostx, demo_dir):
    """The command line with a device that fails and no other to take its share: a clear message
    naming the device, exit 2, and no output folder contents."""
    from tractlens.app.cli import main
    from tractlens.app.pipelines import probabilistic
    from tractlens.gpu import probabilistic_split

    monkeypatch.setattr(probabilistic, "gpu_backends", lambda n: simulated_backends(n))

    def failing(self, start, count):
        raise MemoryError("injected")

    monkeypatch.setattr(probabilistic_split._NumpyShare, "launch", failing)
    out = tmp_path / "prob"
    code = main(["track", "probabilistic", "--samples", str(demo_bedpostx), "--seed",
                 str(demo_dir / "roi_arc_seed.nii.gz"), "--nsamples", "5", "--gpus", "2", "-o", str(out), "--quiet"])  # fmt: skip
    assert code == 2
    assert re.search(r"GPU [01] \(simulated on the CPU\): out of memory while tracking", capsys.readouterr().err)
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.gpu
def test_on_the_gpu_a_failing_share_is_tracked_by_the_other(monkeypatch):
    """Two shares of one GPU (or two GPUs), the second out of memory once its tracker is made
    (its device memory taken, then lost): the survivor's kernel totals equal one run's to the
    last count, and the note names the device."""
    from tractlens.gpu import probabilistic_split
    from tractlens.gpu.backend import get_backend, gpu_backends, gpu_count
    from tractlens.gpu.probabilistic_kernel import track_kernel

    from .test_multidevice import _assert_same, _split_case

    field_, bits, seeds, params = _split_case()
    gpu = get_backend("gpu")
    whole = track_kernel(gpu, field_, bits, seeds, params, 1, 1, seed_matrix=True)
    backends = gpu_backends(2) if gpu_count() > 1 else [gpu, gpu]
    opened = []
    lock = threading.Lock()
    init = probabilistic_split._KernelShare.__init__

    def failing(self, *a, **k):
        init(self, *a, **k)
        with lock:
            opened.append(self)
            second = len(opened) == 2
        if second:
            raise MemoryError("injected")

    monkeypatch.setattr(probabilistic_split._KernelShare, "__init__", failing)
    split = probabilistic_split.track_split(field_, bits, seeds, params, backends, n_targets=1, n_waypoints=1,
                                            seed_matrix=True, batch_streamlines=64)  # fmt: skip
    _assert_same(split, whole)
    assert len(split.provenance["notes"]) == 1 and "out of memory while starting" in split.provenance["notes"][0]
