"""A tractogram written by the writer's own thread while the caller computes the next parts
(``open_tractogram_writer(..., background=True)``, as ``track deterministic`` does): the same
file, failures reported to the caller, nothing left behind."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.io import tractogram_stream
from tractlens.app.io._atomic import SaveError
from tractlens.app.io.tractogram_stream import open_tractogram_writer
from tractlens.app.pipelines.track import deterministic_pipeline

from .test_tractogram_stream import AFFINE, _curving_field, _random_tractogram, _same_file, _stream, _traced_peak

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("suffix", [".trk", ".tck", ".trx"])
def test_background_writing_gives_the_same_file(tmp_path, suffix):
    tract = _random_tractogram(300)
    cuts = [0, 1, 40, 41, 200, 300]
    _stream(tract, tmp_path / f"plain{suffix}", cuts)
    writer = _stream(tract, tmp_path / f"thread{suffix}", cuts, background=True)
    assert (writer.streamlines, writer.points) == (300, len(tract.points))
    _same_file(tmp_path / f"plain{suffix}", tmp_path / f"thread{suffix}")


def test_parts_are_written_by_the_writers_thread(tmp_path, monkeypatch):
    threads = []
    real = tractogram_stream._TrxParts.append

    def append(self, part):
        threads.append(threading.current_thread())
        real(self, part)

    monkeypatch.setattr(tractogram_stream._TrxParts, "append", append)
    _stream(_random_tractogram(50), tmp_path / "a.trx", [0, 10, 50], background=True)
    assert len(threads) == 2 and threading.main_thread() not in threads


def test_a_failure_in_the_thread_reaches_the_caller_and_drops_the_file(tmp_path, monkeypatch):
    real = tractogram_stream._TrxParts.append
    calls = []

    def append(self, part):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, part)

    monkeypatch.setattr(tractogram_stream._TrxParts, "append", append)
    tract = _random_tractogram(100)
    with pytest.raises(SaveError, match="the disk is full"):
        with open_tractogram_writer(tmp_path / "a.trx", tract.affine, tract.dimensions, background=True) as writer:
            for a in range(0, 100, 10):
                writer.append(tract.subset(np.arange(a, a + 10)))
    assert len(calls) < 10  # the thread stopped writing at the failure
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("failing", [2, 5])  # a part's arrays (seen by the next part), the last
def test_a_failure_writing_the_other_arrays_reaches_the_caller_and_drops_the_file(
    tmp_path, monkeypatch, background, failing
):
    """A .trx's offsets and scalars are written by a thread of their own beside the positions:
    a full disk there comes out of the next append or of close, once, and leaves nothing."""
    real = tractogram_stream._TrxParts._put
    calls, threads = [], []

    def put(self, arrays):
        calls.append(1)
        threads.append(threading.current_thread())
        if len(calls) == failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, arrays)

    monkeypatch.setattr(tractogram_stream._TrxParts, "_put", put)
    tract = _random_tractogram(100)
    with pytest.raises(SaveError, match="the disk is full"):
        with open_tractogram_writer(
            tmp_path / "a.trx", tract.affine, tract.dimensions, background=background
        ) as writer:
            for a in range(0, 40, 10):
                writer.append(tract.subset(np.arange(a, a + 10)))
    assert len(calls) == failing  # nothing written after the failure
    assert all(t.name.startswith("trx arrays") for t in threads[: min(failing, 4)])
    assert list(tmp_path.iterdir()) == []
    assert not any(t.name.startswith("trx arrays") for t in threading.enumerate())


def test_a_cancel_with_parts_queued_leaves_nothing(tmp_path, monkeypatch):
    gate = threading.Event()
    real = tractogram_stream._TrxParts.append

    def slow(self, part):
        gate.wait(10)
        real(self, part)

    monkeypatch.setattr(tractogram_stream._TrxParts, "append", slow)
    tract = _random_tractogram(100)
    with pytest.raises(KeyboardInterrupt):
        with open_tractogram_writer(tmp_path / "a.trx", tract.affine, tract.dimensions, background=True) as writer:
            for a in range(0, 30, 10):  # one being written, two queued
                writer.append(tract.subset(np.arange(a, a + 10)))
            threading.Timer(0.2, gate.set).start()
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    assert not any(t.name == "tractogram writer" for t in threading.enumerate())


def test_track_deterministic_on_a_full_disk(tmp_path):
    """A real write failure (a file-size limit) in the writer's thread: exit 2, one message,
    no traceback, no file, no temporary left."""
    field_ = _curving_field()
    tensor = tmp_path / "tensor.nii.gz"
    nib.save(nib.Nifti1Image(field_.tensor, field_.affine), tensor)
    out = tmp_path / "out"
    out.mkdir()
    limit = 20_000  # the tracked file is about 2 MB
    args = ["track", "deterministic", "--tensor", str(tensor), "--tensor-order", "dipy", "--whole-brain"]
    args += ["--device", "cpu", "--quiet", "-o", str(out / "a.trx")]
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        from tractlens.app.cli import main
        sys.exit(main({args!r}))
        """
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "could not be saved" in run.stderr
    assert list(out.iterdir()) == []


@pytest.mark.slow
def test_host_memory_per_output_point_with_the_writers_thread(tmp_path):
    """The bounded queue keeps the slope of the streamed pipeline: ≤ 10 bytes per output point
    between 1 and 4 seeds per voxel (tracemalloc traces the writer's thread too)."""
    field_ = _curving_field(20)

    def run(seeds_per_voxel: int) -> int:
        options = {"whole_brain": True, "device": "cpu", "seeds_per_voxel": seeds_per_voxel, "max_batch": 1024}
        with open_tractogram_writer(tmp_path / "out.trx", field_.affine, field_.shape, background=True) as writer:
            deterministic_pipeline(field_, sink=writer.append, **options)
        return writer.points

    run(1)
    small_peak, small_points = _traced_peak(lambda: run(1))
    large_peak, large_points = _traced_peak(lambda: run(4))
    assert large_points > 3.5 * small_points > 150_000
    slope = (large_peak - small_peak) / (large_points - small_points)
    print(f"background writer: {slope:.1f} bytes per output point")
    assert slope <= 10, f"{slope:.1f} bytes per point"


@pytest.mark.parametrize("n", [1, 15, 16, 1000, (1 << 20) + 7, 3 << 20])
def test_world_positions_of_a_part_are_those_of_the_whole(n):
    """The writer's affine (the shift added as one flat sum, in blocks) gives the bits of
    ``Tractogram.points_world``, for parts shorter and longer than its block."""
    from tractlens.app.io.tractogram_points import points_world_float32
    from tractlens.app.model import Tractogram

    rng = np.random.default_rng(n)
    whole = Tractogram((rng.random((n + 40, 3)) * 100).astype(np.float32), [0, n + 40], AFFINE, (120, 140, 110))
    np.testing.assert_array_equal(points_world_float32(whole.points[:n], AFFINE), whole.points_world()[:n])


def test_append_waits_while_the_queued_points_fill_the_budget(tmp_path, monkeypatch):
    """Parts of 10 points with room for 25 queued: the third waits until the thread has
    written the first; nothing is lost."""
    from tractlens.app.model import Tractogram

    gate = threading.Event()
    real = tractogram_stream._TrxParts.append

    def gated(self, part):
        gate.wait(10)
        real(self, part)

    monkeypatch.setattr(tractogram_stream._TrxParts, "append", gated)
    rng = np.random.default_rng(0)
    parts = [Tractogram(rng.random((10, 3)).astype(np.float32), [0, 10], AFFINE, (120, 140, 110)) for _ in range(4)]
    appended = []
    with open_tractogram_writer(
        tmp_path / "a.trx", AFFINE, (120, 140, 110), background=True, queued_points=25
    ) as writer:

        def feed():
            for part in parts:
                writer.append(part)
                appended.append(1)

        feeder = threading.Thread(target=feed)
        feeder.start()
        feeder.join(0.5)
        assert len(appended) == 2 and feeder.is_alive()  # 20 points queued, the third part waits
        gate.set()
        feeder.join(10)
        assert len(appended) == 4
    assert writer.points == 40 and writer.streamlines == 4
