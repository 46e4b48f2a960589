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
