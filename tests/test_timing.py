"""The phase recorder of app/timing.py: exclusive seconds per phase, thread safety, the file
``$TRACTLENS_TIMINGS`` names, and the CLI's ``timings`` in ``--json``."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from tractlens.app import timing
from tractlens.app.timing import PhaseRecorder

SLEEP = 0.05


def test_a_phase_counts_the_time_of_its_block():
    rec = PhaseRecorder()
    with rec.phase("read"):
        time.sleep(SLEEP)
    snap = rec.snapshot()
    assert snap["phases_s"]["read"] == pytest.approx(SLEEP, abs=0.04)
    assert snap["calls"] == {"read": 1}
    assert snap["total_s"] >= snap["phases_s"]["read"]


def test_a_nested_phase_takes_its_seconds_out_of_the_outer_one():
    rec = PhaseRecorder()
    with rec.phase("compute"):
        time.sleep(SLEEP)
        with rec.phase("read"):
            time.sleep(2 * SLEEP)
        time.sleep(SLEEP)
    phases = rec.snapshot()["phases_s"]
    assert phases["read"] == pytest.approx(2 * SLEEP, abs=0.04)
    assert phases["compute"] == pytest.approx(2 * SLEEP, abs=0.04)  # not 4 × SLEEP
    assert sum(phases.values()) <= rec.snapshot()["total_s"]


def test_repeated_phases_add_up_and_are_counted():
    rec = PhaseRecorder()
    for _ in range(3):
        with rec.phase("write"):
            time.sleep(SLEEP / 2)
    snap = rec.snapshot()
    assert snap["calls"]["write"] == 3
    assert snap["phases_s"]["write"] == pytest.approx(1.5 * SLEEP, abs=0.05)


def test_a_phase_that_raises_is_still_counted_and_closed():
    rec = PhaseRecorder()
    with pytest.raises(ValueError), rec.phase("read"):
        time.sleep(SLEEP)
        raise ValueError("bad file")
    with rec.phase("compute"):
        time.sleep(SLEEP)
    phases = rec.snapshot()["phases_s"]
    assert phases["read"] == pytest.approx(SLEEP, abs=0.04)
    assert phases["compute"] == pytest.approx(SLEEP, abs=0.04)  # not nested in the failed read


def test_threads_keep_their_own_stacks_and_their_totals_add_up():
    rec = PhaseRecorder()
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        with rec.phase("compute"):
            time.sleep(SLEEP)
            with rec.phase("read"):
                time.sleep(SLEEP)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = rec.snapshot()
    assert snap["calls"] == {"compute": 4, "read": 4}
    assert snap["phases_s"]["read"] == pytest.approx(4 * SLEEP, abs=0.1)
    assert snap["phases_s"]["compute"] == pytest.approx(4 * SLEEP, abs=0.1)


def test_reset_forgets_everything():
    rec = PhaseRecorder()
    with rec.phase("read"):
        pass
    rec.reset()
    snap = rec.snapshot()
    assert snap["phases_s"] == {} and snap["calls"] == {}


def test_cpu_seconds_count_every_thread_of_the_process_since_reset():
    """``cpu_s`` is the process's CPU time since the reset, a writer thread's work included: a
    thread that has itself used 0.2 s of CPU makes it at least that; a reset starts it again."""
    rec = PhaseRecorder()

    def busy() -> None:
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            sum(range(1000))

    worker = threading.Thread(target=busy)
    worker.start()
    worker.join()
    assert rec.snapshot()["cpu_s"] >= 0.2
    rec.reset()
    assert 0.0 <= rec.snapshot()["cpu_s"] < 0.1


def test_details_add_up_per_name_beside_the_phases():
    rec = PhaseRecorder()
    rec.detail("tractogram_writer", {"world": 1.0, "flush": 0.5})
    rec.detail("tractogram_writer", {"world": 0.25})
    snap = rec.snapshot()
    assert snap["details_s"] == {"tractogram_writer": {"world": 1.25, "flush": 0.5}} and snap["phases_s"] == {}
    rec.reset()
    assert rec.snapshot()["details_s"] == {}


def test_host_memory_peaks_are_sampled_at_phase_ends():
    rec = PhaseRecorder()
    with rec.phase("compute"):
        block = bytearray(64 << 20)  # 64 MiB touched: the peak RSS must cover it
        block[::4096] = b"x" * len(block[::4096])
    snap = rec.snapshot()
    assert snap["host_peak_rss_bytes_by_phase"]["compute"] >= 64 << 20
    assert snap["host_peak_rss_bytes"] >= snap["host_peak_rss_bytes_by_phase"]["compute"]
    del block


def test_the_device_pool_is_not_imported_to_be_measured(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert timing.device_pool_bytes() is None
    assert "cupy" not in sys.modules


def test_write_timings_goes_to_the_file_the_environment_names(tmp_path, monkeypatch):
    target = tmp_path / "t.json"
    monkeypatch.delenv(timing.TIMINGS_ENV, raising=False)
    assert timing.write_timings() is None  # no file named: nothing written
    monkeypatch.setenv(timing.TIMINGS_ENV, str(target))
    with timing.phase("write"):
        pass
    assert timing.write_timings(extra={"command": "x"}) == target
    payload = json.loads(target.read_text())
    assert payload["command"] == "x" and "write" in payload["phases_s"]


def test_the_cli_reports_read_compute_write_in_json_and_in_the_timings_file(tmp_path, monkeypatch, capsys):
    import nibabel as nib
    import numpy as np

    from tractlens.app.cli import main

    rng = np.random.default_rng(0)
    bvecs = rng.normal(size=(12, 3))
    bvecs /= np.linalg.norm(bvecs, axis=1, keepdims=True)
    bvals = np.r_[0.0, np.full(12, 1000.0)]
    bvecs = np.r_[[[0.0, 0.0, 0.0]], bvecs]
    d = np.diag([1.5e-3, 0.4e-3, 0.4e-3])
    signal = 1000 * np.exp(-bvals * np.einsum("ki,ij,kj->k", bvecs, d, bvecs))
    data = np.broadcast_to(signal, (6, 6, 4, len(bvals))).astype(np.float32).copy()
    nib.save(nib.Nifti1Image(data, np.eye(4)), tmp_path / "dwi.nii")
    np.savetxt(tmp_path / "dwi.bval", bvals[None], fmt="%g")
    np.savetxt(tmp_path / "dwi.bvec", bvecs.T, fmt="%.6f")
    nib.save(nib.Nifti1Image(np.ones((6, 6, 4), np.uint8), np.eye(4)), tmp_path / "mask.nii.gz")
    target = tmp_path / "timings.json"
    monkeypatch.setenv(timing.TIMINGS_ENV, str(target))
    argv = ["fit-dti", str(tmp_path / "dwi.nii"), "--mask", str(tmp_path / "mask.nii.gz")]
    assert main([*argv, "--device", "cpu", "--quiet", "--json", "-o", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    phases = summary["timings"]["phases_s"]
    assert {"read", "compute", "write"} <= set(phases)
    assert summary["timings"]["calls"]["read"] == 2  # the DWI, then the mask inside the fit
    written = json.loads(target.read_text())
    assert written["command"] == "fit-dti"
    assert written["phases_s"]["write"] >= phases["write"] > 0
    assert written["total_s"] >= sum(written["phases_s"].values())
