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
    # Python's own Ctrl+C handler (another library imported in this worker may have put its own)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            _write(out, ["map1.nii", "map2.nii", "rec.json"], "second")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert _files(out) == {"map1.nii": "second", "map2.nii": "second", "rec.json": "second"}
    assert [p.name for p in moved][-2:] == ["rec.json", ".rec.files"]  # the record after the maps, then the list


def test_a_staging_folder_hours_old_is_removed_and_a_young_one_kept(tmp_path):
    """A killed run's stage is cleared by age: a young one may be a live run's on another host or in
    another container (its process is not visible from here)."""
    import time

    out = tmp_path / "out"
    for name in ("old", "young"):
        (out / f"{PARTIAL}{name}").mkdir(parents=True)
        (out / f"{PARTIAL}{name}" / "map1.nii").write_text("half")
    hours_ago = time.time() - 7 * 3600
    os.utime(out / f"{PARTIAL}old", (hours_ago, hours_ago))
    _write(out, ["map1.nii", "rec.json"], "new")
    assert sorted(p.name for p in out.glob(PARTIAL + "*")) == [f"{PARTIAL}young"]


def test_a_folder_without_the_record_has_no_earlier_set(tmp_path):
    """A subject's own gm.nii.gz (a name a CSD fit also writes) in a folder that never held a fit
    is kept: only a folder with the command's record can hold its earlier set."""
    out = tmp_path / "subject"
    out.mkdir()
    (out / "map2.nii").write_text("the user's")
    _write(out, ["map1.nii", "rec.json"], "new")
    assert _files(out) == {"map1.nii": "new", "map2.nii": "the user's", "rec.json": "new"}


def test_two_keys_in_one_folder_are_two_sets(tmp_path):
    """fit-dti with two prefixes into one folder: the second does not remove the first's maps."""
    out = tmp_path / "out"
    for prefix in ("a", "b"):
        with output_set(out, "rec.json", key=f"rec-{prefix}") as stage:
            (stage / f"{prefix}_FA.nii").write_text(prefix)
            (stage / "rec.json").write_text(prefix)
    assert _files(out) == {"a_FA.nii": "a", "b_FA.nii": "b", "rec.json": "b"}


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


def test_fit_dti_with_two_prefixes_keeps_both_fits_and_csd_keeps_a_subjects_own_tissue_maps(demo_dir, tmp_path):
    from tractlens.app.cli import main

    out = tmp_path / "subject"
    out.mkdir()
    (out / "gm.nii.gz").write_text("the subject's own")  # a name CSD's multi-tissue fit writes too
    for prefix in ("sub01", "sub02"):
        assert main(["fit-dti", str(demo_dir / "dwi.nii.gz"), "-o", str(out), "--prefix", prefix,
                     "--mask", str(demo_dir / "roi_arc_seed.nii.gz"), "--device", "cpu", "--quiet"]) == 0  # fmt: skip
    assert len(list(out.glob("sub01_*"))) == len(list(out.glob("sub02_*"))) > 10
    assert main(["fit-csd", str(demo_dir / "dwi.nii.gz"), "-o", str(out), "--mask", str(demo_dir / "roi_arc_seed.nii.gz"),
                 "--device", "cpu", "--quiet"]) == 0  # fmt: skip
    assert (out / "gm.nii.gz").read_text() == "the subject's own" and (out / "fod.nii.gz").exists()
