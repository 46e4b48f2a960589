"""Whole-brain I/O paths: a bedpostX folder read on several threads into the cache, ball & sticks
outputs streamed from the masked samples."""

from __future__ import annotations

import gzip
import itertools
import os
import time

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import bedpostx, bedpostx_cache, load_bedpostx, save_volume

AFFINE = np.diag([2.0, 2.0, 2.0, 1.0])


def _folder(folder, rng, shape=(7, 6, 5), fibres=3, samples=9):
    folder.mkdir()
    save_volume(rng.random(shape) > 0.3, AFFINE, folder / "nodif_brain_mask.nii.gz", dtype=np.uint8)
    for i, name in itertools.product(range(1, fibres + 1), ("th", "ph", "f")):
        values = rng.uniform(0, 3, (*shape, samples))
        values[1, 2, 3, 4] = np.inf
        save_volume(values, AFFINE, folder / f"merged_{name}{i}samples.nii.gz")
    when = time.time() - 100
    for path in folder.iterdir():
        os.utime(path, (when, when))
    return folder


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACTLENS_BEDPOSTX_CACHE", raising=False)
    return tmp_path / "cache" / "bedpostx"


@pytest.mark.parametrize("threads", [1, 4])
def test_a_folder_read_on_threads_holds_each_files_values_in_its_place(tmp_path, rng, cache_dir, monkeypatch, threads):
    monkeypatch.setattr(bedpostx, "MAX_READ_THREADS", threads)
    monkeypatch.setattr(bedpostx, "_read_threads", lambda n, b: threads)
    folder = _folder(tmp_path / "s.bedpostX", rng)
    first, second = load_bedpostx(folder), load_bedpostx(folder)  # read (and cached), then mapped
    for samples in (first, second):
        for (i, name), stick in itertools.product(enumerate(("th", "ph", "f")), range(3)):
            want = nib.load(folder / f"merged_{name}{stick + 1}samples.nii.gz").get_fdata(dtype=np.float32)
            got = (samples.theta, samples.phi, samples.f)[i][..., stick, :]
            assert np.array_equal(got, np.nan_to_num(want, nan=0.0, posinf=0.0, neginf=0.0))
    assert bedpostx_cache.entry_dir(folder).exists()


def test_a_damaged_file_among_many_is_named_and_leaves_no_cache_entry(tmp_path, rng, cache_dir):
    folder = _folder(tmp_path / "s.bedpostX", rng)
    path = folder / "merged_ph2samples.nii.gz"
    stat = path.stat()
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data)[: stat.st_size // 2])  # cut in the middle of the data
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**11))
    with pytest.raises(InputError) as err:
        load_bedpostx(folder)
    assert "merged_ph2samples" in str(err.value)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())


def test_bedpostx_written_from_masked_samples_is_the_grid_writers_folder(tmp_path, rng, monkeypatch):
    from tractlens.app.io.bedpostx import BedpostSamples, save_bedpostx, save_bedpostx_masked

    monkeypatch.setattr(bedpostx, "WRITE_SLAB_BYTES", 7 * 6 * 5 * 4 * 2)  # two samples a slab: several slabs
    monkeypatch.setattr(bedpostx, "DYAD_BLOCK_VOXELS", 13)
    shape, fibres, samples = (7, 6, 5), 2, 9
    mask = rng.random(shape) > 0.4
    n = int(mask.sum())
    theta, phi = rng.uniform(0, np.pi, (n, fibres, samples)), rng.uniform(-np.pi, np.pi, (n, fibres, samples))
    f = rng.uniform(0, 0.5, (n, fibres, samples))
    s0, d = rng.uniform(100, 200, (n, samples)), rng.uniform(1e-4, 3e-3, (n, samples))
    theta, phi, f, s0, d = (a.astype(np.float32) for a in (theta, phi, f, s0, d))

    def grid(values):
        out = np.zeros(shape + values.shape[1:], dtype=np.float32)
        out[mask] = values
        return out

    bvals, bvecs = np.array([0.0, 1000.0]), np.array([[0.0, 0, 0], [1, 0, 0]])
    grid_samples = BedpostSamples(grid(theta), grid(phi), grid(f), mask, AFFINE)
    old = save_bedpostx(tmp_path / "grid", grid_samples, s0=grid(s0), d=grid(d), bvals=bvals, bvecs=bvecs)
    new = save_bedpostx_masked(tmp_path / "masked", mask, AFFINE, theta, phi, f, s0=s0, d=d, bvals=bvals, bvecs=bvecs)
    assert sorted(old) == sorted(new) and len(new) == 8 * fibres + 6
    for name in old:
        a, b = (tmp_path / "grid" / name).read_bytes(), (tmp_path / "masked" / name).read_bytes()
        if name.endswith(".gz"):
            a, b = gzip.decompress(a), gzip.decompress(b)
        assert a == b, name  # header and data, byte for byte
