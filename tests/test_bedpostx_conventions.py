"""bedpostX folders given as probtrackx takes them (``--samples DIR/merged``), and the cache
entry a fit writes beside its folder so the first tracking run maps it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import bedpostx_cache, load_bedpostx
from tractlens.app.io.bedpostx import split_samples_path


def assert_same_samples(a, b):
    for name in ("theta", "phi", "f", "mask", "affine"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert getattr(a, name).dtype == getattr(b, name).dtype, name


def test_fsl_base_name_reads_the_folder(demo_bedpostx, tmp_path):
    by_folder = load_bedpostx(demo_bedpostx, cache=False)
    by_base = load_bedpostx(demo_bedpostx / "merged", cache=False)
    assert_same_samples(by_base, by_folder)
    assert by_base.path == str(demo_bedpostx)
    # another base name, as probtrackx accepts any: files named BASE_th1samples...
    other = tmp_path / "other"
    other.mkdir()
    for path in demo_bedpostx.iterdir():
        name = path.name.replace("merged_", "custom_") if path.name.startswith("merged_") else path.name
        shutil.copy(path, other / name)
    assert split_samples_path(other / "custom") == (other, "custom")
    assert_same_samples(load_bedpostx(other / "custom", cache=False), by_folder)
    # a cache entry per base name: the folder's own merged_* files would be another entry
    assert bedpostx_cache.entry_dir(other / "custom") != bedpostx_cache.entry_dir(other)


def test_base_names_that_are_not_bedpostx_are_refused(demo_bedpostx, tmp_path):
    with pytest.raises(InputError, match="not a folder") as info:
        load_bedpostx(demo_bedpostx / "nonsense", cache=False)
    assert "subject.bedpostX/merged" in str(info.value)
    with pytest.raises(InputError, match="not a folder"):
        load_bedpostx(tmp_path / "missing" / "merged", cache=False)


def test_track_probabilistic_takes_the_base_name(demo_bedpostx, demo_dir, tmp_path):
    import nibabel as nib

    from tests.test_cli import run_cli

    seed = demo_dir / "roi_crossing_lr_seed.nii.gz"
    outputs = {}
    for label, samples in (("folder", demo_bedpostx), ("base", demo_bedpostx / "merged")):
        out = tmp_path / label
        args = ["track", "probabilistic", "--samples", str(samples), "--seed", str(seed), "--nsamples", "5"]
        result = run_cli(*args, "--device", "cpu", "--seed-rng", "4", "-o", str(out), "--quiet")
        assert result.returncode == 0, result.stderr
        outputs[label] = nib.load(out / "fdt_paths.nii.gz").get_fdata()
    assert outputs["folder"].sum() > 0
    np.testing.assert_array_equal(outputs["base"], outputs["folder"])


def test_the_window_opens_the_base_name(demo_bedpostx):
    from tractlens.app.loaders import load_layers

    by_base = load_layers(demo_bedpostx / "merged", device="cpu")
    by_folder = load_layers(demo_bedpostx, device="cpu")
    assert [layer.name for layer in by_base] == [layer.name for layer in by_folder]


# ---------------------------------------------------------------- the cache a fit writes


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A small ball & sticks fit (short chain, model 1), not yet written."""
    from tractlens.app.io import DWI
    from tractlens.app.pipelines.ballstick import fit_ballstick_pipeline
    from tractlens.gpu.ballstick import BallStickParams, ball_stick_signal

    rng = np.random.default_rng(1)
    bvals = np.concatenate([np.zeros(4), np.full(40, 1000.0)])
    bvecs = np.concatenate([np.zeros((4, 3)), rng.normal(size=(40, 3))])
    bvecs[4:] /= np.linalg.norm(bvecs[4:], axis=1, keepdims=True)
    shape = (4, 3, 3)
    n = int(np.prod(shape))
    th, ph = rng.uniform(0, np.pi, (n, 1)), rng.uniform(-np.pi, np.pi, (n, 1))
    signal = ball_stick_signal(bvals, bvecs, np.full(n, 900.0), np.full(n, 1e-3), th, ph, np.full((n, 1), 0.5))
    signal += rng.normal(0, 20, signal.shape)
    affine = np.array([[-1.7, 0.1, 0, 30.3], [0, 1.7, 0.2, -20.1], [0, 0, 1.9, 5.7], [0, 0, 0, 1]])
    dwi = DWI(signal.reshape(*shape, -1).astype(np.float32), affine, bvals, bvecs)
    mask = np.ones(shape, bool)
    mask[0, 0, 0] = mask[3, 2, 1] = False
    params = BallStickParams(n_fibres=2, model=1, burnin=10, njumps=20, sample_every=2)
    return fit_ballstick_pipeline(dwi, mask=mask, params=params, device="cpu")


def test_a_fit_writes_the_cache_entry_that_the_first_read_maps(fitted, tmp_path, monkeypatch):
    from tractlens.app.io import bedpostx
    from tractlens.app.pipelines.ballstick import write_ballstick_outputs

    folder = tmp_path / "sub.bedpostX"
    write_ballstick_outputs(fitted, folder)
    entry = bedpostx_cache.entry_dir(folder)
    assert (entry / "manifest.json").exists()

    def no_file_reads(*args, **kwargs):
        raise AssertionError("the folder's files were read although the fit cached them")

    monkeypatch.setattr(bedpostx, "_read_folder", no_file_reads)
    mapped = load_bedpostx(folder)  # the first read after the fit: mapped
    monkeypatch.undo()
    assert mapped.cache_entry == entry
    assert_same_samples(mapped, load_bedpostx(folder, cache=False))  # bit for bit what the files hold


def test_the_fit_writes_no_cache_when_it_is_off(fitted, tmp_path, monkeypatch):
    from tractlens.app.pipelines.ballstick import write_ballstick_outputs

    monkeypatch.setenv("TRACTLENS_BEDPOSTX_CACHE", "0")
    folder = tmp_path / "off.bedpostX"
    write_ballstick_outputs(fitted, folder)
    assert not bedpostx_cache.entry_dir(folder).exists()
    monkeypatch.delenv("TRACTLENS_BEDPOSTX_CACHE")
    write_ballstick_outputs(fitted, folder, cache=False)
    assert not bedpostx_cache.entry_dir(folder).exists()


def test_a_changed_file_after_the_fit_invalidates_its_entry(fitted, tmp_path):
    import os

    from tractlens.app.pipelines.ballstick import write_ballstick_outputs

    folder = tmp_path / "changed.bedpostX"
    write_ballstick_outputs(fitted, folder)
    target = folder / "merged_f1samples.nii.gz"
    stat = target.stat()
    os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    from tractlens.app.io.bedpostx import source_files

    assert bedpostx_cache.load_entry(folder, source_files(folder)) is None
