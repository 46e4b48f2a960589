"""Reading a bedpostX folder: the streamed reader (a few volumes inflated at a time into the
voxel-major arrays, straight into the cache entry's files) gives, bit for bit, what nibabel reads."""

from __future__ import annotations

import gzip
import os
import threading
import time

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import bedpostx, bedpostx_cache, load_bedpostx

SHAPE, FIBRES, SAMPLES = (6, 5, 4), 2, 7


def _nibabel_reference(folder, suffix):
    """(X, Y, Z, fibres, samples) per parameter as nibabel reads the files, NaN and ±Inf as 0."""
    out = {}
    for key, name in (("theta", "th"), ("phi", "ph"), ("f", "f")):
        per_fibre = []
        for i in range(1, FIBRES + 1):
            data = nib.load(folder / f"merged_{name}{i}samples{suffix}").get_fdata(dtype=np.float32)
            per_fibre.append(np.where(np.isfinite(data), data, 0).astype(np.float32))
        out[key] = np.stack(per_fibre, axis=3)
    return out


def _write_folder(folder, rng, suffix=".nii.gz", dtype=np.float32, scaled=False):
    folder.mkdir()
    affine = np.array([[-1.25, 0, 0, 90], [0, 1.25, 0.1, -126], [0, 0, 1.25, -72], [0, 0, 0, 1]])
    mask = rng.uniform(size=SHAPE) < 0.7
    nib.save(nib.Nifti1Image(mask.astype(np.uint8), affine), folder / f"nodif_brain_mask{suffix}")
    for i in range(1, FIBRES + 1):
        for name in ("th", "ph", "f"):
            data = rng.uniform(-4, 4, (*SHAPE, SAMPLES)).astype(np.float32)
            data[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
            if scaled:
                img = nib.Nifti1Image(np.round(np.nan_to_num(data * 1000, posinf=0, neginf=0)).astype(np.int16), affine)
                img.header.set_slope_inter(0.001, 0.5)
            else:
                img = nib.Nifti1Image(data.astype(dtype), affine)
            nib.save(img, folder / f"merged_{name}{i}samples{suffix}")
    old = time.time() - 10  # settled: the cache takes it
    for path in folder.iterdir():
        os.utime(path, (old, old))
    return folder


@pytest.mark.parametrize(
    "suffix, dtype, scaled",
    [
        (".nii.gz", np.float32, False),
        (".nii", np.float32, False),
        (".nii.gz", np.float64, False),
        (".nii.gz", None, True),
    ],
)
@pytest.mark.parametrize("chunk_bytes", [4, 3 * 4 * int(np.prod(SHAPE)), 1 << 30])
def test_the_reader_gives_what_nibabel_reads(tmp_path, rng, monkeypatch, suffix, dtype, scaled, chunk_bytes):
    """One volume, three volumes (a short last chunk) or the whole file at a time; plain float32
    files take the streamed path, others nibabel's; with and without the cache."""
    folder = _write_folder(tmp_path / "s.bedpostX", rng, suffix, dtype, scaled)
    monkeypatch.setattr(bedpostx, "READ_CHUNK_BYTES", chunk_bytes)
    expected = _nibabel_reference(folder, suffix)
    plain = load_bedpostx(folder, cache=False)
    first = load_bedpostx(folder)  # reads into the cache entry's files
    mapped = load_bedpostx(folder)  # maps them
    assert first.cache_entry is not None and mapped.cache_entry == first.cache_entry
    for samples in (plain, first, mapped):
        for key, want in expected.items():
            got = getattr(samples, key)
            assert got.dtype == np.float32 and got.shape == (*SHAPE, FIBRES, SAMPLES)
            np.testing.assert_array_equal(got, want, err_msg=key)
        np.testing.assert_array_equal(samples.affine, plain.affine)
        np.testing.assert_array_equal(samples.mask, plain.mask)


def test_streamed_path_is_taken_for_plain_float32_only(tmp_path, rng, monkeypatch):
    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    calls = []
    original = bedpostx._inflate_into
    monkeypatch.setattr(bedpostx, "_inflate_into", lambda *a: calls.append(a[0]) or original(*a))
    load_bedpostx(folder, cache=False)
    assert len(calls) == 3 * FIBRES
    scaled = _write_folder(tmp_path / "scaled.bedpostX", rng, scaled=True)
    calls.clear()
    load_bedpostx(scaled, cache=False)
    assert calls == []


def test_the_entry_is_written_behind_the_first_read_and_later_maps_are_copy_on_write(tmp_path, rng):
    """The first read returns its arrays at once (read-only: the entry is being written from
    them) and publishes the entry behind it; a later read maps the entry copy-on-write: writing
    into those arrays changes neither the cache nor the next read."""
    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    first = load_bedpostx(folder)
    assert first.pending_cache is not None
    with pytest.raises(ValueError, match="read-only"):
        first.theta[...] = 123.0
    entry = first.pending_cache.wait(timeout=60)
    assert entry == bedpostx_cache.entry_dir(folder) and first.cache_entry == entry
    mapped = load_bedpostx(folder)
    assert mapped.cache_entry == entry and mapped.pending_cache is None
    before = mapped.theta.copy()
    np.testing.assert_array_equal(before, first.theta)
    mapped.theta[...] = 123.0
    again = load_bedpostx(folder)
    np.testing.assert_array_equal(again.theta, before)


def test_a_second_read_in_the_process_waits_for_the_entry_written_behind(tmp_path, rng, monkeypatch):
    """While the entry of a first read is being written, a second read of the folder waits for
    it and maps it (it does not inflate the files again)."""
    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    gate = threading.Event()
    real_save = bedpostx_cache.EntryWriter.save

    def slow_save(self, name, array):
        gate.wait(30)
        real_save(self, name, array)

    monkeypatch.setattr(bedpostx_cache.EntryWriter, "save", slow_save)
    first = load_bedpostx(folder)
    assert not first.pending_cache.done
    calls = []
    monkeypatch.setattr(bedpostx, "_read_folder", lambda *a: calls.append(a))
    threading.Timer(0.3, gate.set).start()
    second = load_bedpostx(folder)
    assert calls == [] and second.cache_entry == bedpostx_cache.entry_dir(folder)
    np.testing.assert_array_equal(second.f, first.f)


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_writer(tmp_path, rng):
    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    entry = bedpostx_cache.entry_dir(folder)
    stale = entry.with_name(f".{entry.name}.tmp-dead0000")
    fresh = entry.with_name(f".{entry.name}.tmp-busy0000")  # another process writing right now
    for path in (stale, fresh):
        path.mkdir(parents=True)
        (path / "theta.npy").write_bytes(b"half")
    old = time.time() - 2 * bedpostx_cache.STALE_TMP_S
    os.utime(stale, (old, old))
    load_bedpostx(folder).pending_cache.wait(timeout=60)
    assert not stale.exists() and fresh.exists() and (entry / "manifest.json").exists()


def test_a_truncated_samples_file_is_an_input_error_and_leaves_no_entry(tmp_path, rng):
    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    path = folder / "merged_f2samples.nii.gz"
    raw = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(raw[: len(raw) - 4 * int(np.prod(SHAPE)) - 10]))
    old = time.time() - 10
    os.utime(path, (old, old))
    with pytest.raises(InputError, match="could not be read") as info:
        load_bedpostx(folder)
    assert "merged_f2samples" in str(info.value)
    entry = bedpostx_cache.entry_dir(folder)
    assert not entry.exists()
    assert not any(p.name.startswith(f".{entry.name}.tmp") for p in entry.parent.iterdir())


def test_a_process_that_exits_right_after_the_first_read_still_publishes_the_entry(tmp_path, rng):
    """The entry is written behind the read by non-daemon threads: a command that ends as soon as
    it has read (the interpreter shutting down) finishes the entry first."""
    import subprocess
    import sys

    folder = _write_folder(tmp_path / "s.bedpostX", rng)
    cache = tmp_path / "own-cache"
    code = "import sys; from tractlens.app.io import load_bedpostx; load_bedpostx(sys.argv[1])"
    env = {**os.environ, "TRACTLENS_CACHE": str(cache), "TRACTLENS_BEDPOSTX_CACHE": "1"}
    subprocess.run([sys.executable, "-c", code, str(folder)], env=env, check=True, timeout=120)
    entries = [p for p in (cache / "bedpostx").iterdir()]
    assert len(entries) == 1 and (entries[0] / "manifest.json").exists(), entries
