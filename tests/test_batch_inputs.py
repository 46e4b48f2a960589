"""What users of ``tractlens batch`` get wrong, and what a run killed outright leaves: each refused
before any work with the reason and a fix, the same files reached another way skipped by the next
run, and a killed run's half-written files removed by the next run on the host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_batch import make_bids, write_config
from tractlens.app.batch import staging as staging_folders
from tractlens.app.batch.config import load_config
from tractlens.app.batch.dataset import find_series
from tractlens.app.cli import main
from tractlens.app.errors import InputError


def test_config_paths_are_the_same_however_the_config_was_reached(tmp_path, monkeypatch):
    (tmp_path / "cfg").mkdir()
    config = tmp_path / "cfg" / "p.toml"
    config.write_text('[connectome]\nlabels = "atlas/sub-{subject}_dseg.nii.gz"\nlut = "../luts/dseg.txt"\n')
    monkeypatch.chdir(tmp_path / "cfg")
    near = load_config("p.toml", ["connectome"])["connectome"]
    monkeypatch.chdir(tmp_path)
    far = load_config(str(tmp_path / "cfg" / ".." / "cfg" / "p.toml"), ["connectome"])["connectome"]
    assert near == far
    assert near["labels"] == str(tmp_path / "cfg" / "atlas" / "sub-{subject}_dseg.nii.gz")
    assert near["lut"] == str(tmp_path / "luts" / "dseg.txt")


def test_the_dataset_reached_through_dot_dot_or_a_link_gives_the_same_inputs(demo_dir, tmp_path, monkeypatch):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    (tmp_path / "link").symlink_to(bids)
    monkeypatch.chdir(bids / "sub-01")
    ways = [bids, tmp_path / "bids" / ".." / "bids", tmp_path / "link", Path("..")]
    found = {str(find_series(way)[0].dwi) for way in ways}
    assert found == {str((bids / "sub-01" / "dwi" / "sub-01_dwi.nii.gz").resolve())}


def test_gradient_files_named_bvals_and_bvecs_are_the_series_inputs(demo_dir, tmp_path):
    """The fit reads ``.bvals``/``.bvecs`` beside the image: the batch must record them as the
    series' inputs (a changed .bvecs then redoes the fit), not find none."""
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    folder = bids / "sub-01" / "dwi"
    for ext in ("bval", "bvec"):
        (folder / f"sub-01_dwi.{ext}").rename(folder / f"sub-01_dwi.{ext}s")
    [series] = find_series(bids)
    assert (series.bval.name, series.bvec.name) == ("sub-01_dwi.bvals", "sub-01_dwi.bvecs")


def test_a_participant_asked_for_without_dwi_is_refused_not_dropped(demo_dir, tmp_path, caplog):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    (bids / "sub-07" / "anat").mkdir(parents=True)
    shutil.copy(demo_dir / "mask.nii.gz", bids / "sub-07" / "anat" / "sub-07_T1w.nii.gz")
    with pytest.raises(InputError, match="participant 07 has no DWI series"):
        find_series(bids, ["07", "01"])
    assert [s.subject for s in find_series(bids, ["01"])] == ["01"]
    with caplog.at_level("WARNING", logger="tractlens"):
        assert [s.subject for s in find_series(bids)] == ["01"]  # the whole dataset: sub-07 named, left out
    assert any("without a DWI series left out: sub-07" in r.getMessage() for r in caplog.records)


def test_an_unknown_session_lists_the_sessions_there(demo_dir, tmp_path):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    session = bids / "sub-01" / "ses-pre"
    session.mkdir()
    (bids / "sub-01" / "dwi").rename(session / "dwi")
    for f in (session / "dwi").iterdir():
        f.rename(f.with_name(f.name.replace("sub-01_", "sub-01_ses-pre_")))
    with pytest.raises(InputError, match="no session post") as info:
        find_series(bids, session_labels=["post"])
    assert "Choose among: pre" in str(info.value)


def _batch(bids, out, *extra) -> list[str]:
    return ["batch", str(bids), "-o", str(out), "--pipeline", "fit-dti", "--workers", "1", *extra]


def test_the_dataset_itself_or_another_raw_dataset_is_refused_as_output(demo_dir, tmp_path, capsys):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    description = (bids / "dataset_description.json").read_text()
    assert main(_batch(bids, bids)) == 2
    assert "is the BIDS dataset itself" in capsys.readouterr().err
    other = make_bids(tmp_path / "other", demo_dir, subjects=("02",))
    assert main(_batch(bids, other)) == 2
    assert "is a raw BIDS dataset" in capsys.readouterr().err
    assert (bids / "dataset_description.json").read_text() == description
    assert sorted(p.name for p in bids.rglob("*") if p.is_file()) == [
        "dataset_description.json", "sub-01_dwi.bval", "sub-01_dwi.bvec", "sub-01_dwi.nii.gz"]  # fmt: skip


@pytest.mark.parametrize("where", ["file", "below-a-file"])
def test_an_output_that_cannot_be_a_folder_is_named(demo_dir, tmp_path, capsys, where):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" if where == "file" else tmp_path / "afile" / "sub"
    code = main(_batch(bids, out))
    err = capsys.readouterr().err
    assert code == 2 and "internal error" not in err and "afile" in err


def test_a_scheduler_address_dask_cannot_read_is_an_input_error(demo_dir, tmp_path, capsys):
    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01",))
    code = main(["batch", str(bids), "-o", str(tmp_path / "d"), "--pipeline", "fit-dti",
                 "--scheduler", "tpc://127.0.0.1:8786"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "cannot reach the Dask scheduler at tpc://" in err
    assert not (tmp_path / "d" / ".staging").exists()


@pytest.mark.parametrize(("value", "message"), [('"high"', "invalid float value: 'high'"),
                                                ("2.5", "invalid int value: '2.5'")])  # fmt: skip
def test_a_config_value_of_the_wrong_type_gives_the_reason_not_a_usage_block(tmp_path, value, message):
    key = "fa-threshold" if "high" in value else "seeds-per-voxel"
    config = tmp_path / "p.toml"
    config.write_text(f"[track-deterministic]\n{key} = {value}\n")
    with pytest.raises(InputError) as info:
        load_config(config, ["track-deterministic"])
    text = str(info.value)
    assert message in text and "p.toml" in text and "usage:" not in text and "t.nii.gz" not in text


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_killed_runs_staging_is_removed_by_the_next_run_on_the_host(tmp_path):
    root = tmp_path / ".staging"
    host = socket.gethostname()
    namespace = staging_folders._pid_namespace()
    owners = {"dead": (host, _dead_pid()), "live": (host, os.getppid()), "elsewhere": ("another-host", _dead_pid())}
    for name, (where, pid) in owners.items():
        (root / name / "sub-01_track").mkdir(parents=True)
        (root / name / "sub-01_track" / "half.trx.parts").write_bytes(b"x" * 100)
        (root / name / "owner.json").write_text(json.dumps({"host": where, "pid": pid, "pid_namespace": namespace}))
    (root / "unknown").mkdir()  # no owner record (an older version's run): not ours to judge
    (root / "container").mkdir()  # the same host name, another PID namespace: its numbers are not ours
    (root / "container" / "owner.json").write_text(json.dumps({"host": host, "pid": _dead_pid(),
                                                               "pid_namespace": "pid:[1]"}))  # fmt: skip
    mine = root / "mine"
    staging_folders.claim_staging(mine)
    assert staging_folders.clear_dead_runs(root, keep=mine) == ["dead"]
    assert sorted(p.name for p in root.iterdir()) == ["container", "elsewhere", "live", "mine", "unknown"]
    assert json.loads((mine / "owner.json").read_text())["pid"] == os.getpid()


def test_sigterm_ends_the_run_like_ctrl_c(demo_dir, tmp_path, monkeypatch, capsys):
    """A batch system's time limit sends SIGTERM: exit status 130, the staging folder removed."""
    from tractlens.app.batch import runner

    bids = make_bids(tmp_path / "bids", demo_dir, subjects=("01", "02"))
    config = write_config(tmp_path / "p.toml", demo_dir)

    def terminate(self, key, status):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(runner.CohortProgress, "finished", terminate)
    previous = signal.getsignal(signal.SIGTERM)
    code = main([*_batch(bids, tmp_path / "d"), "--config", str(config), "--quiet"])
    assert code == 130 and "interrupted" in capsys.readouterr().err
    assert not (tmp_path / "d" / ".staging").exists()
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is the command's only


def test_importing_the_batch_system_cluster_keeps_ctrl_c(monkeypatch):
    """dask_jobqueue's import replaces the SIGINT handler with sys.exit(): Ctrl+C then ended a
    --cluster run with exit status 0. The engine puts the process's handler back."""
    import importlib

    pytest.importorskip("dask_jobqueue", reason="the batch extra is part of the test extra")
    from tractlens.app.batch import engines

    def forget() -> None:  # imported afresh: its import sets the handler
        for name in [m for m in sys.modules if m == "dask_jobqueue" or m.startswith("dask_jobqueue.")]:
            monkeypatch.delitem(sys.modules, name)

    mine = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        forget()
        importlib.import_module("dask_jobqueue")  # the premise: a plain import takes Ctrl+C
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        signal.signal(signal.SIGINT, signal.default_int_handler)
        forget()
        engines._jobqueue_keys("slurm")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, mine)
