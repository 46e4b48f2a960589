"""A command's output files land in their folder as one set: an interrupted write leaves the earlier
set as it was, and a run that writes fewer files leaves none of the earlier run's extra files
looking like its own (a bedpostX folder of 1 stick read as 2 sticks, another model's maps)."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from tractlens.app.io.output_set import PARTIAL, names_matching, output_set
from tractlens.app.jobs import Cancelled


def _files(folder):
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def _write(folder, names, text):
    with output_set(folder, "rec.json", ("map{i}.nii", "rec.json")) as stage:
        for name in names:
            (stage / name).write_text(text)
    return folder


def test_a_set_replaces_the_earlier_one_and_removes_what_it_did_not_write(tmp_path):
    out = _write(tmp_path / "out", ["map1.nii", "map2.nii", "rec.json"], "first")
    (out / "notes.txt").write_text("the user's")
    _write(out, ["map1.nii", "rec.json"], "second")
    assert _files(out) == {"map1.nii": "second", "rec.json": "second", "notes.txt": "the user's"}
    assert not list(out.glob(PARTIAL + "*"))


def test_a_folder_of_an_earlier_version_is_cleared_by_the_templates_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("map1.nii", "map2.nii", "rec.json", "mapX.nii", "other.nii"):
        (out / name).write_text("old")  # no manifest: written before sets
    _write(out, ["map1.nii", "rec.json"], "new")
    assert _files(out) == {"map1.nii": "new", "rec.json": "new", "mapX.nii": "old", "other.nii": "old"}


@pytest.mark.parametrize("error", [RuntimeError("disk full"), Cancelled(), KeyboardInterrupt()])
def test_a_failure_while_writing_leaves_the_earlier_set_as_it_was(tmp_path, error):
    out = _write(tmp_path / "out", ["map1.nii", "map2.nii", "rec.json"], "first")
    with pytest.raises(type(error)):
        with output_set(out, "rec.json", ("map{i}.nii",)) as stage:
            (stage / "map1.nii").write_text("half")
            raise error
    assert _files(out) == {"map1.nii": "first", "map2.nii": "first", "rec.json": "first"}
    assert not list(out.glob(PARTIAL + "*"))


def test_ctrl_c_while_the_set_is_moved_into_place_comes_after_it(tmp_path, monkeypatch):
    """The renames are not interrupted half way: the signal is handled once the set is in place."""
    out = _write(tmp_path / "out", ["map1.nii", "map2.nii", "rec.json"], "first")
    real_replace = os.replace
    moved = []

    def replace(a, b):
        if not moved:
            os.kill(os.getpid(), signal.SIGINT)  # arrives between the first and the second rename
        moved.append(b)
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", replace)
    assert threading.current_thread() is threading.main_thread()
    with pytest.raises(KeyboardInterrupt):
        _write(out, ["map1.nii", "map2.nii", "rec.json"], "second")
    assert _files(out) == {"map1.nii": "second", "map2.nii": "second", "rec.json": "second"}
    assert [p.name for p in moved][-2:] == ["rec.json", ".rec.files"]  # the record after the maps, then the list


def test_a_staging_folder_of_a_killed_run_is_removed_by_the_next(tmp_path):
    import subprocess
    import sys

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)  # fmt: skip
    out = tmp_path / "out"
    (out / f"{PARTIAL}{dead}-abcd").mkdir(parents=True)
    (out / f"{PARTIAL}{dead}-abcd" / "map1.nii").write_text("half")
    _write(out, ["map1.nii", "rec.json"], "new")
    assert not list(out.glob(PARTIAL + "*"))


def test_templates_match_their_names_only():
    pattern = names_matching(["dyads{i}.nii.gz", "seeds_to_{target}.nii.gz", "waytotal"])
    assert all(pattern.match(n) for n in ("dyads2.nii.gz", "seeds_to_M1.nii.gz", "waytotal"))
    assert not any(pattern.match(n) for n in ("dyadsX.nii.gz", "dyads2.nii", "waytotal.bak", "my_seeds_to_a.nii.gz"))


def test_ball_and_sticks_again_with_fewer_sticks_leaves_a_folder_of_that_many(demo_dir, tmp_path):
    """A rerun with --nfibres 1 into a folder of 2 sticks: the folder reads as 1 stick with or
    without the cache (probtrackx reads the files)."""
    from tractlens.app.io import load_bedpostx, load_dwi
    from tractlens.app.io.bedpostx import source_files
    from tractlens.app.pipelines.ballstick import BallStickParams, fit_ballstick_pipeline, write_ballstick_outputs

    dwi = load_dwi(demo_dir / "dwi.nii.gz")
    small = BallStickParams(n_fibres=2, njumps=40, burnin=40, sample_every=20)
    mask = _small_mask(demo_dir)
    out = tmp_path / "bpx"
    write_ballstick_outputs(fit_ballstick_pipeline(dwi, mask=mask, params=small, device="cpu"), out)
    assert (out / "merged_th2samples.nii.gz").exists()
    one = BallStickParams(n_fibres=1, njumps=40, burnin=40, sample_every=20)
    write_ballstick_outputs(fit_ballstick_pipeline(dwi, mask=mask, params=one, device="cpu"), out)
    assert not list(out.glob("*2samples*")) and not (out / "dyads2.nii.gz").exists()
    assert len([p for p in source_files(out) if "merged_th" in p.name]) == 1
    assert load_bedpostx(out).n_fibres == 1


def _small_mask(demo_dir):
    import nibabel as nib

    img = nib.load(demo_dir / "mask.nii.gz")
    mask = np.zeros(img.shape, bool)
    mask[10:14, 10:14, 5:7] = np.asarray(img.dataobj)[10:14, 10:14, 5:7] > 0
    assert mask.any()
    return mask
