"""COMMIT's write stage: the same bytes as writing the whole filtered copy and full-array maps,
in bounded memory (parts of streamlines, blocks of voxel rows)."""

from __future__ import annotations

import dataclasses
import tracemalloc
import zipfile
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from tests.benchmarks.bench_commit import bundle_inputs, synthetic_files
from tractlens.app.io import load_tractogram, save_tractogram, save_volume
from tractlens.app.pipelines import commit as commit_pipeline_module
from tractlens.app.pipelines.commit import (
    CommitParams,
    commit_pipeline,
    kept_streamlines,
    write_commit_outputs,
    write_kept_streamlines,
)
from tractlens.app.usecases.commit import commit_from_files
from tractlens.gpu import commit_operator

MAP_NAMES = ("fit_RMSE", "fit_NRMSE", "compartment_IC", "compartment_EC", "compartment_ISO")


def _whole_maps(result) -> dict[str, np.ndarray]:
    """The maps through full (n_rows, M) float64 arrays and one ``bincount`` of all segments."""
    y = np.asarray(result.y, dtype=np.float64)
    residual = result.model - y
    rmse = np.sqrt((residual**2).mean(1))
    norm = np.sqrt((y**2).mean(1))
    nrmse = np.where(norm > 0, rmse / np.where(norm > 0, norm, 1.0), 0.0)
    p = result.problem
    ic_x, ec_x, iso_x = p.split(result.x)
    seg = p.segments
    ic = np.bincount(seg.row, weights=seg.length * ic_x.sum(0)[seg.fiber], minlength=p.n_rows)
    ec = np.bincount(p.ec_row, weights=ec_x, minlength=p.n_rows)
    values = (rmse, nrmse, ic, ec, iso_x.sum(1))
    return {name: result.volume(v) for name, v in zip(MAP_NAMES, values)}


def _write_whole(result, folder: Path, suffix: str) -> None:
    """What the write stage wrote through whole copies: the reference of the streamed one."""
    folder.mkdir()
    np.savetxt(folder / "streamline_weights.txt", result.weights, fmt="%.9g")
    keep = result.weights > 0
    filtered = kept_streamlines(result.tractogram, keep)
    filtered.streamline_scalars["commit_weight"] = result.weights[keep].astype(np.float32)
    save_tractogram(filtered, folder / f"tractogram_filtered{suffix}")
    for key, volume in _whole_maps(result).items():
        save_volume(volume, result.affine, folder / f"{key}.nii.gz")


def _assert_same_files(whole: Path, streamed: Path, suffix: str) -> None:
    names = ["streamline_weights.txt", f"tractogram_filtered{suffix}", *(f"{k}.nii.gz" for k in MAP_NAMES)]
    for name in names:
        if name.endswith(".trx"):  # every member's bytes (the zip's own records hold times)
            with zipfile.ZipFile(whole / name) as a, zipfile.ZipFile(streamed / name) as b:
                assert sorted(a.namelist()) == sorted(b.namelist())
                for member in a.namelist():
                    assert a.read(member) == b.read(member), member
        else:
            assert (streamed / name).read_bytes() == (whole / name).read_bytes(), name


@pytest.fixture(scope="module")
def bundle_result():
    dwi, tract = bundle_inputs(1200, shape=(16, 16, 16), n_meas=30)
    rng = np.random.default_rng(1)
    tract.point_scalars["fa"] = rng.uniform(0, 1, len(tract.points)).astype(np.float32)
    tract.streamline_scalars["length_mm"] = rng.uniform(10, 90, len(tract))
    result = commit_pipeline(dwi, tract, params=CommitParams(max_iter=30), device="cpu")
    result.weights[::7] = 0.0  # filtered out whatever the fit says, so parts mix kept and dropped
    return result


@pytest.mark.parametrize("suffix", [".trk", ".tck", ".trx"])
def test_streamed_outputs_are_the_bytes_of_the_whole_copies(bundle_result, tmp_path, monkeypatch, suffix):
    result = bundle_result
    assert 0 < (result.weights > 0).sum() < len(result.weights)
    _write_whole(result, tmp_path / "whole", suffix)
    # parts of a few streamlines and blocks of a few rows: many boundaries
    monkeypatch.setattr(commit_pipeline_module, "WRITE_PART_POINTS", 997)
    monkeypatch.setattr(commit_pipeline_module, "MAP_BLOCK_BYTES", 8 * result.problem.n_meas * 13)
    monkeypatch.setattr(commit_operator, "CHUNK", 301)
    write_commit_outputs(result, tmp_path / "streamed", suffix)
    _assert_same_files(tmp_path / "whole", tmp_path / "streamed", suffix)


def test_nothing_kept_writes_the_empty_file(bundle_result, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_result, "weights", np.zeros_like(bundle_result.weights))
    _write_whole(bundle_result, tmp_path / "whole", ".trk")
    write_commit_outputs(bundle_result, tmp_path / "streamed", ".trk")
    _assert_same_files(tmp_path / "whole", tmp_path / "streamed", ".trk")


def test_error_maps_in_row_blocks_equal_the_whole(bundle_result):
    rmse, nrmse = bundle_result.fit_errors(block_rows=1)
    whole = _whole_maps(bundle_result)
    np.testing.assert_array_equal(bundle_result.volume(rmse), whole["fit_RMSE"])
    np.testing.assert_array_equal(bundle_result.volume(nrmse), whole["fit_NRMSE"])


def test_demo_outputs_are_the_bytes_of_the_whole_copies(demo_dir, tmp_path):
    result, suffix = commit_from_files(demo_dir / "dwi.nii.gz", demo_dir / "bundles.trk", device="cpu")
    _write_whole(result, tmp_path / "whole", suffix)
    write_commit_outputs(result, tmp_path / "streamed", suffix)
    _assert_same_files(tmp_path / "whole", tmp_path / "streamed", suffix)


def test_synthetic_trx_outputs_are_the_bytes_of_the_whole_copies(tmp_path, monkeypatch):
    folder = synthetic_files(tmp_path / "in", 300, shape=(12, 12, 12), n_meas=20, points=40)
    dwi = folder / "dwi.nii"
    tract = load_tractogram(folder / "tracts.tck", reference=(nib.load(dwi).affine, (12, 12, 12)))
    save_tractogram(tract, folder / "tracts.trx")
    result, suffix = commit_from_files(
        dwi,
        folder / "tracts.trx",
        mask=folder / "mask.nii.gz",
        params=CommitParams(max_iter=20),
        device="cpu",
        mapped=False,  # read into voxel coordinates, as the whole copies are made from
    )
    assert suffix == ".trx"
    _write_whole(result, tmp_path / "whole", suffix)
    monkeypatch.setattr(commit_pipeline_module, "WRITE_PART_POINTS", 500)
    write_commit_outputs(result, tmp_path / "streamed", suffix)
    _assert_same_files(tmp_path / "whole", tmp_path / "streamed", suffix)


@pytest.fixture(scope="module")
def large_result():
    dwi, tract = bundle_inputs(24000, shape=(24, 24, 24), n_meas=60)  # 912 k points, 13.8 k rows
    result = commit_pipeline(dwi, tract, params=CommitParams(max_iter=3), device="cpu")
    result.weights[::5] = 0.0
    return result


def _peak_bytes(write) -> int:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        write()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("suffix", [".trk", ".trx"])
def test_write_stage_memory_does_not_grow_with_the_tractogram(large_result, tmp_path, monkeypatch, suffix):
    """The tracemalloc peak of writing every output grows by less than a quarter of 12 bytes (a
    float32 point) per point of the tractogram (the whole copies took more than 36): the same fit
    written with all its streamlines and with a quarter of them."""
    monkeypatch.setattr(commit_pipeline_module, "WRITE_PART_POINTS", 1 << 14)
    monkeypatch.setattr(commit_pipeline_module, "MAP_BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(commit_operator, "CHUNK", 1 << 12)
    whole = large_result
    n = len(whole.weights) // 4
    quarter = dataclasses.replace(whole, tractogram=whole.tractogram.subset(np.arange(n)), weights=whole.weights[:n])
    # the writer's process-wide table of the grid's shift, made once for every later write
    write_kept_streamlines(quarter.tractogram, quarter.weights > 0, quarter.weights, tmp_path / "warm.trk")
    sizes = ((quarter, "quarter"), (whole, "whole"))
    peaks = [_peak_bytes(lambda r=r, name=name: write_commit_outputs(r, tmp_path / name, suffix)) for r, name in sizes]
    more_points = len(whole.tractogram.points) - len(quarter.tractogram.points)
    slope = (peaks[1] - peaks[0]) / more_points
    print(f"\nwrite stage {suffix}: peaks {peaks[0] / 1e6:.1f} and {peaks[1] / 1e6:.1f} MB, {slope:.2f} B/point")
    assert slope < 0.25 * 12


def test_maps_hold_blocks_of_rows_not_the_signal(large_result, monkeypatch):
    """The maps' tracemalloc peak stays under a quarter of the (n_rows, M) float64 model (the
    full-array maps made four such arrays)."""
    monkeypatch.setattr(commit_pipeline_module, "MAP_BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(commit_operator, "CHUNK", 1 << 12)
    peak = _peak_bytes(large_result.maps)
    print(f"\nmaps: peak {peak / 1e6:.2f} MB; model {large_result.model.nbytes / 1e6:.1f} MB")
    assert peak < 0.25 * large_result.model.nbytes


def test_a_trx_used_as_stored_writes_its_own_positions_and_fits_as_when_converted(tmp_path):
    """An uncompressed .trx is cut into segments from its millimetres and the kept streamlines
    are written with the very bytes of the input (positions and per-point scalars); the fit
    equals the one on the tractogram converted to voxels up to float32 rounding of the points."""
    from tractlens.app.io.tractogram_mapped import MappedTractogram

    folder = synthetic_files(tmp_path / "in", 300, shape=(12, 12, 12), n_meas=20, points=40)
    dwi = folder / "dwi.nii"
    tract = load_tractogram(folder / "tracts.tck", reference=(nib.load(dwi).affine, (12, 12, 12)))
    tract.point_scalars["fa"] = np.random.default_rng(0).uniform(0, 1, len(tract.points)).astype(np.float32)
    save_tractogram(tract, folder / "tracts.trx")
    args = (dwi, folder / "tracts.trx")
    # EC compartments per distinct orientation: a voxel's main orientations (the default) can
    # change where two of its orientations carry nearly the same length and a piece moves across
    # a boundary, which would hide what this compares
    kwargs = dict(mask=folder / "mask.nii.gz", params=CommitParams(max_iter=20, ec_orientations=0), device="cpu")
    mapped, _ = commit_from_files(*args, **kwargs)
    converted, _ = commit_from_files(*args, **kwargs, mapped=False)
    assert isinstance(mapped.tractogram, MappedTractogram)
    # a point on a voxel boundary may fall on the other side after the other rounding: compare
    # what does not depend on that, each streamline's length inside the mask
    per_fiber = [
        np.bincount(r.problem.segments.fiber, r.problem.segments.length, minlength=300) for r in (mapped, converted)
    ]
    np.testing.assert_allclose(*per_fiber, rtol=1e-5)
    # the pieces that moved across a boundary change the fit a little (1.5e-4 here)
    np.testing.assert_allclose(mapped.weights, converted.weights, rtol=1e-3, atol=1e-6)
    mapped.weights[::3] = 0.0
    write_commit_outputs(mapped, tmp_path / "out", ".trx")
    keep = mapped.weights > 0
    with (
        zipfile.ZipFile(folder / "tracts.trx") as a,
        zipfile.ZipFile(tmp_path / "out" / "tractogram_filtered.trx") as b,
    ):
        source = np.frombuffer(a.read("positions.3.float32"), "<f4").reshape(-1, 3)
        written = np.frombuffer(b.read("positions.3.float32"), "<f4").reshape(-1, 3)
        fa_in = np.frombuffer(a.read("dpv/fa.float32"), "<f4")
        fa_out = np.frombuffer(b.read("dpv/fa.float32"), "<f4")
    point_keep = np.repeat(keep, mapped.tractogram.lengths)
    np.testing.assert_array_equal(written, source[point_keep])  # the input's own bytes
    np.testing.assert_array_equal(fa_out, fa_in[point_keep])
    back = load_tractogram(tmp_path / "out" / "tractogram_filtered.trx")
    assert len(back) == int(keep.sum())
    np.testing.assert_allclose(back.streamline_scalars["commit_weight"], mapped.weights[keep].astype(np.float32))


def test_a_trx_with_a_nan_point_is_refused_naming_the_file(tmp_path):
    from tractlens.app.errors import InputError

    folder = synthetic_files(tmp_path / "in", 50, shape=(12, 12, 12), n_meas=20, points=40)
    dwi = folder / "dwi.nii"
    tract = load_tractogram(folder / "tracts.tck", reference=(nib.load(dwi).affine, (12, 12, 12)))
    save_tractogram(tract, folder / "tracts.trx")
    with zipfile.ZipFile(folder / "tracts.trx") as z:
        info = z.getinfo("positions.3.float32")
    with open(folder / "tracts.trx", "r+b") as f:  # the first point's x, in place
        f.seek(info.header_offset + 30 + len(info.filename) + len(info.extra))
        f.write(np.float32(np.nan).tobytes())
    with pytest.raises(InputError, match="NaN or infinite") as caught:
        commit_from_files(dwi, folder / "tracts.trx", params=CommitParams(max_iter=2), device="cpu")
    assert str(folder / "tracts.trx") in str(caught.value)


def test_a_tck_read_in_chunks_fits_as_when_loaded_and_writes_its_own_positions(tmp_path, monkeypatch):
    """A plain .tck is read in chunks as stored (offsets from its delimiters, points by pread,
    chunks smaller than a streamline here): the same segments and fit as the tractogram loaded
    whole into voxels, up to float32 rounding of the points; the kept streamlines are written
    with the input's own positions."""
    from tractlens.app.io import tractogram_mapped_tck
    from tractlens.app.io.tractogram_mapped import MappedTractogram
    from tractlens.gpu import commit_segments as commit  # where the host cutting reads its chunk size

    folder = synthetic_files(tmp_path / "in", 300, shape=(12, 12, 12), n_meas=20, points=40)
    dwi = folder / "dwi.nii"
    monkeypatch.setattr(tractogram_mapped_tck, "SCAN_ROWS", 1000)  # the scan in many chunks
    monkeypatch.setattr(commit, "HOST_SEGMENT_CHUNK_POINTS", 777)  # chunks that split streamlines' rows
    # EC compartments per distinct orientation: a voxel's main orientations (the default) can
    # change where two of its orientations carry nearly the same length and a piece moves across
    # a boundary, which would hide what this compares
    kwargs = dict(mask=folder / "mask.nii.gz", params=CommitParams(max_iter=20, ec_orientations=0), device="cpu")
    mapped, _ = commit_from_files(dwi, folder / "tracts.tck", **kwargs)
    loaded, _ = commit_from_files(dwi, folder / "tracts.tck", **kwargs, mapped=False)
    assert isinstance(mapped.tractogram, MappedTractogram)
    np.testing.assert_array_equal(mapped.tractogram.offsets, loaded.tractogram.offsets)
    per_fiber = [
        np.bincount(r.problem.segments.fiber, r.problem.segments.length, minlength=300) for r in (mapped, loaded)
    ]
    np.testing.assert_allclose(*per_fiber, rtol=1e-5)
    np.testing.assert_allclose(mapped.weights, loaded.weights, rtol=1e-3, atol=1e-6)
    mapped.weights[::3] = 0.0
    write_commit_outputs(mapped, tmp_path / "out", ".tck")
    keep = mapped.weights > 0
    source = nib.streamlines.load(str(folder / "tracts.tck")).streamlines
    written = nib.streamlines.load(str(tmp_path / "out" / "tractogram_filtered.tck")).streamlines
    assert len(written) == int(keep.sum())
    np.testing.assert_array_equal(written.get_data(), np.concatenate([source[i] for i in np.flatnonzero(keep)]))
