"""Fast I/O: gzip through ISA-L, NIfTI read without double copies, the bedpostX cache."""

from __future__ import annotations

import gzip
import itertools
import logging
import mmap
import os
import time

import nibabel as nib
import numpy as np
import pytest

from tractlens.app.errors import InputError
from tractlens.app.io import _gzip, bedpostx, bedpostx_cache
from tractlens.app.io.bedpostx import load_bedpostx
from tractlens.app.io.nifti import load_image, load_volume, read_array, save_volume

AFFINE = np.diag([-2.0, 2.0, 2.0, 1.0])


@pytest.fixture
def isal():
    return pytest.importorskip("isal", reason="python-isal (the fast-io extra) is not installed")


@pytest.fixture
def stdlib_gzip(monkeypatch):
    monkeypatch.setenv("TRACTLENS_FAST_GZIP", "0")


def _volume(rng, shape=(23, 19, 11, 7)):
    return np.round(rng.normal(100.0, 30.0, shape), 2).astype(np.float32)


def test_fast_gzip_writes_the_same_data_bytes_as_the_standard_library(isal, tmp_path, rng, monkeypatch):
    data = _volume(rng)
    monkeypatch.setenv("TRACTLENS_FAST_GZIP", "0")
    assert not _gzip.fast_gzip_enabled()
    save_volume(data, AFFINE, tmp_path / "zlib.nii.gz")
    monkeypatch.setenv("TRACTLENS_FAST_GZIP", "1")
    assert _gzip.fast_gzip_enabled()
    save_volume(data, AFFINE, tmp_path / "isal.nii.gz")
    zlib_bytes = (tmp_path / "zlib.nii.gz").read_bytes()
    isal_bytes = (tmp_path / "isal.nii.gz").read_bytes()
    assert zlib_bytes != isal_bytes  # another compressor wrote it ...
    assert gzip.decompress(isal_bytes) == gzip.decompress(zlib_bytes)  # ... the same NIfTI bytes
    for name in ("zlib", "isal"):
        for fast in ("0", "1"):
            monkeypatch.setenv("TRACTLENS_FAST_GZIP", fast)
            back = load_volume(tmp_path / f"{name}.nii.gz").data
            assert back.dtype == np.float32 and np.array_equal(back, data)


def test_fast_gzip_reads_concatenated_members_and_refuses_a_cut_file(isal, tmp_path, rng):
    data = _volume(rng)
    save_volume(data, AFFINE, tmp_path / "whole.nii")
    raw = (tmp_path / "whole.nii").read_bytes()
    (tmp_path / "members.nii.gz").write_bytes(gzip.compress(raw[:777]) + gzip.compress(raw[777:]))
    assert np.array_equal(load_volume(tmp_path / "members.nii.gz").data, data)
    whole = gzip.compress(raw)
    (tmp_path / "cut.nii.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"cut\.nii\.gz: the image data could not be read"):
        load_volume(tmp_path / "cut.nii.gz")


def test_without_isal_nibabel_opens_gzip_itself(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(_gzip, "_isal", lambda: None)
    save_volume(_volume(rng), AFFINE, tmp_path / "a.nii.gz")
    with _gzip.gzip_open(str(tmp_path / "a.nii.gz"), "rb") as handle:
        assert isinstance(handle, gzip.GzipFile)


@pytest.mark.parametrize("suffix", [".nii", ".nii.gz"])
def test_read_array_gives_nibabels_values_for_every_type_and_scaling(tmp_path, rng, suffix, monkeypatch):
    monkeypatch.setattr("tractlens.app.io.nifti.CONVERT_CHUNK_BYTES", 1000)  # many slabs
    cases = itertools.product(
        [np.int16, np.uint8, np.float32, np.float64, ">f4", ">i2"], [None, 2.5, 1e-3], [None, 7.0], [(5, 6, 7, 9)]
    )
    for dtype, slope, inter, shape in cases:
        values = rng.uniform(-50, 200, shape)
        values[0, 0, 0, :2] = [np.nan, np.inf] if np.dtype(dtype).kind == "f" else 0
        img = nib.Nifti1Image(values.astype(dtype), AFFINE)
        img.header.set_data_dtype(dtype)
        if slope is not None:
            img.header.set_slope_inter(slope, inter or 0.0)
        path = tmp_path / f"a{suffix}"
        nib.save(img, path)
        for wanted in (np.float32, np.float64):
            expected = nib.load(path).get_fdata(dtype=wanted)
            got = read_array(load_image(path), path, dtype=wanted)
            assert got.dtype == wanted and got.shape == expected.shape, (dtype, slope, inter)
            assert np.array_equal(got, expected, equal_nan=True), (dtype, slope, inter, wanted)


def _maps_a_file(array) -> bool:
    while array is not None:
        if isinstance(array, mmap.mmap):
            return True
        array = getattr(array, "base", None)
    return False


def test_a_float32_nii_is_mapped_not_copied(tmp_path, rng):
    data = _volume(rng)
    save_volume(data, AFFINE, tmp_path / "dwi.nii")
    got = read_array(load_image(tmp_path / "dwi.nii"), tmp_path / "dwi.nii")
    assert not _maps_a_file(read_array(load_image(tmp_path / "dwi.nii"), tmp_path / "dwi.nii", dtype=np.float64))
    assert _maps_a_file(got) and not got.flags.owndata
    assert np.array_equal(got, data) and got.flags.f_contiguous
    before = (tmp_path / "dwi.nii").read_bytes()
    got[0, 0, 0, 0] = -1.0  # copy-on-write: the file keeps its data
    assert (tmp_path / "dwi.nii").read_bytes() == before


# --- the bedpostX cache -----------------------------------------------------------------


def _bedpostx(folder, rng, shape=(6, 5, 4), fibres=2, samples=7):
    folder.mkdir()
    mask = rng.random(shape) > 0.3
    save_volume(mask, AFFINE, folder / "nodif_brain_mask.nii.gz", dtype=np.uint8)
    for i, name in itertools.product(range(1, fibres + 1), ("th", "ph", "f")):
        values = rng.uniform(0, 3, (*shape, samples))
        values[0, 0, 0, 0] = np.nan
        save_volume(values, AFFINE, folder / f"merged_{name}{i}samples.nii.gz")
    _age(folder)
    return folder


def _age(folder, seconds=100.0):
    """Give every file of ``folder`` an old modification time (fresh files are not cached)."""
    when = time.time() - seconds
    for path in folder.iterdir():
        os.utime(path, (when, when))


def _read_as_before(folder):
    """The loader's values as it made them before the cache: get_fdata, nan_to_num, stack."""
    arrays = []
    for name in ("th", "ph", "f"):
        fibres = []
        for i in itertools.count(1):
            path = folder / f"merged_{name}{i}samples.nii.gz"
            if not path.exists():
                break
            fibres.append(np.nan_to_num(nib.load(path).get_fdata(dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0))
        arrays.append(np.stack(fibres, axis=3))
    return arrays


@pytest.fixture
def count_reads(monkeypatch):
    calls = []
    real = bedpostx._read_samples_into  # every sample file read goes through it

    def counted(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(bedpostx, "_read_samples_into", counted)
    return calls


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TRACTLENS_BEDPOSTX_CACHE", raising=False)
    return tmp_path / "cache" / "bedpostx"


def test_bedpostx_cache_is_built_then_mapped_without_reading_the_folder(tmp_path, rng, cache_dir, count_reads, caplog):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    expected = _read_as_before(folder)
    with caplog.at_level(logging.INFO):
        first = load_bedpostx(folder)
        assert first.pending_cache.wait(timeout=60) is not None  # written behind the read
    assert len(count_reads) == 6
    built = [r for r in caplog.records if "cached in" in r.getMessage()]
    assert len(built) == 1 and built[0].levelno == logging.WARNING
    entry = bedpostx_cache.entry_dir(folder)
    assert sorted(p.name for p in entry.iterdir()) == ["f.npy", "manifest.json", "mask.npy", "phi.npy", "theta.npy"]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        second = load_bedpostx(folder)
    assert len(count_reads) == 6  # nothing read again
    assert not [r for r in caplog.records if "cached in" in r.getMessage()]
    # the first read returns its own arrays (read-only while they are written); the second maps the entry
    assert _maps_a_file(second.theta) and not _maps_a_file(first.theta) and not first.theta.flags.writeable
    for samples in (first, second):
        for got, want in zip((samples.theta, samples.phi, samples.f), expected):
            assert got.dtype == np.float32 and np.array_equal(got, want)
        assert np.array_equal(samples.affine, nib.load(folder / "nodif_brain_mask.nii.gz").affine)
    assert np.array_equal(second.mask, first.mask) and second.mask.dtype == bool


def test_bedpostx_cache_is_invalidated_by_a_touch_or_a_size_change(tmp_path, rng, cache_dir, count_reads):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    load_bedpostx(folder)
    assert len(count_reads) == 6
    path = folder / "merged_f2samples.nii.gz"
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    load_bedpostx(folder)
    assert len(count_reads) == 12  # read again (and cached again)
    load_bedpostx(folder)
    assert len(count_reads) == 12
    stat = path.stat()
    new = rng.uniform(0, 3, (6, 5, 4, 7))
    save_volume(new, AFFINE, path)  # other values: another compressed size
    assert path.stat().st_size != stat.st_size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old time
    samples = load_bedpostx(folder)
    assert len(count_reads) == 18
    assert np.array_equal(samples.f[..., 1, :], new.astype(np.float32))


def test_freshly_written_folders_are_not_cached(tmp_path, rng, cache_dir, count_reads):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    _age(folder, seconds=0.0)
    load_bedpostx(folder)
    load_bedpostx(folder)
    assert len(count_reads) == 12 and not bedpostx_cache.entry_dir(folder).exists()


def test_an_unwritable_cache_falls_back_to_reading_with_one_warning(tmp_path, rng, monkeypatch, count_reads, caplog):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    expected = _read_as_before(folder)
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("TRACTLENS_CACHE", str(tmp_path / "a-file"))
    with caplog.at_level(logging.WARNING):
        samples = load_bedpostx(folder)
        assert samples.pending_cache.wait(timeout=60) is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "could not cache the bedpostX folder" in warnings[0].getMessage()
    assert np.array_equal(samples.theta, expected[0]) and len(count_reads) == 6


def test_a_full_disk_leaves_no_partial_cache_entry(tmp_path, rng, cache_dir, count_reads, monkeypatch, caplog):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    real_save = bedpostx_cache.np.save  # the entry's arrays are written with it

    def full(path, *args, **kwargs):
        if str(path).endswith("phi.npy"):
            raise OSError(28, "No space left on device")
        return real_save(path, *args, **kwargs)

    monkeypatch.setattr(bedpostx_cache.np, "save", full)
    with caplog.at_level(logging.WARNING):
        samples = load_bedpostx(folder)
        assert samples.pending_cache.wait(timeout=60) is None
    assert "the disk is full" in caplog.text and samples.cache_entry is None
    assert samples.theta.shape == (6, 5, 4, 2, 7)
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    monkeypatch.setattr(bedpostx_cache.np, "save", real_save)
    load_bedpostx(folder)
    load_bedpostx(folder)
    assert len(count_reads) == 12  # cached on the second read, mapped on the third


def test_the_cache_can_be_turned_off(tmp_path, rng, cache_dir, count_reads, monkeypatch):
    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    monkeypatch.setenv("TRACTLENS_BEDPOSTX_CACHE", "0")
    load_bedpostx(folder)
    load_bedpostx(folder, cache=True)
    load_bedpostx(folder)
    assert len(count_reads) == 18 and not cache_dir.exists()


def test_probabilistic_tracking_from_the_mapped_cache_is_the_same(
    demo_bedpostx, demo_dir, tmp_path, cache_dir, count_reads, monkeypatch
):
    import shutil

    from tractlens.app.pipelines.probabilistic import ProbParams, prepare_probabilistic

    folder = tmp_path / "demo.bedpostX"
    shutil.copytree(demo_bedpostx, folder)
    _age(folder)
    results = []
    for cache in ("0", "1", "1"):  # read without the cache; read and cache; map
        monkeypatch.setenv("TRACTLENS_BEDPOSTX_CACHE", cache)
        run = prepare_probabilistic(folder, demo_dir / "roi_arc_seed.nii.gz", params=ProbParams(n_samples=10))
        results.append(run.track(device="cpu"))
    assert len(count_reads) == 2 * 6 and bedpostx_cache.entry_dir(folder).exists()  # the third read nothing
    assert results[0].waytotal > 0
    for result in results[1:]:
        assert np.array_equal(result.paths, results[0].paths) and result.waytotal == results[0].waytotal


def test_the_tracking_field_is_kept_beside_the_cache_entry_and_mapped_next_time(tmp_path, rng, cache_dir, monkeypatch):
    """The field tracking derives from the samples (unit directions in voxel axes, fractions,
    index) is saved in the entry when first made and mapped by later runs: equal arrays, no
    trigonometry; a damaged one (wrong shape) is made again."""
    from tractlens.app.pipelines import probabilistic as prob

    folder = _bedpostx(tmp_path / "s.bedpostX", rng)
    first = load_bedpostx(folder)
    made = prob.sample_field(first)  # read, field made, both kept once the entry is written
    assert first.pending_cache.wait(timeout=60) is not None  # the field's callback ran before the wait ends
    entry = bedpostx_cache.entry_dir(folder)
    assert sorted(p.name for p in entry.glob("field_*")) == [
        f"field_{k}-v{bedpostx_cache.DERIVED_VERSION}.npy" for k in ("dirs", "f", "index")
    ]

    def no_trigonometry(*args):
        raise AssertionError("the field was made again")

    with monkeypatch.context() as m:
        m.setattr(prob, "_sample_field", no_trigonometry)
        mapped = prob.sample_field(load_bedpostx(folder))
    for name in ("dirs", "f", "index", "voxel_size"):
        assert np.array_equal(getattr(mapped, name), getattr(made, name)), name
    assert _maps_a_file(mapped.dirs)
    np.save(entry / f"field_f-v{bedpostx_cache.DERIVED_VERSION}.npy", np.zeros((2, 2), np.float32))  # damaged
    again = prob.sample_field(load_bedpostx(folder))
    assert np.array_equal(again.f, made.f) and not _maps_a_file(again.f)


def test_dyads_computed_in_blocks_are_those_of_the_whole_mask(rng, monkeypatch):
    from tractlens.gpu.ballstick import dyadic_mean

    shape = (7, 6, 5)
    mask = rng.random(shape) > 0.4
    theta, phi = (rng.uniform(0, 3, (*shape, 3, 9)).astype(np.float32) for _ in range(2))
    samples = bedpostx.BedpostSamples(theta, phi, np.zeros_like(theta), mask, AFFINE)
    monkeypatch.setattr(bedpostx, "DYAD_BLOCK_VOXELS", 17)
    dyads, dispersion = samples.dyads()
    whole, whole_dispersion = dyadic_mean(theta[mask], phi[mask])
    assert np.array_equal(dyads[mask], whole.astype(np.float32)) and not dyads[~mask].any()
    assert np.array_equal(dispersion[mask], whole_dispersion.astype(np.float32))
