"""COMMIT filtering of a tractogram: the fit and its outputs (the use case that checks the inputs
and runs it for every caller is :mod:`app.usecases.commit`).

The DWI signal of the voxels the tractogram passes through (within the mask, when one
is given), divided by each voxel's mean b=0 signal, is fitted with the forward model of
:mod:`gpu.commit`; every streamline gets a weight, and those with weight 0 are filtered
out. The streamlines are brought onto the DWI grid through the affines. EC
compartments come from a peaks file (``(X, Y, Z, 3K)`` directions; zero vectors are no
peak) or, without one, from the orientations of the segments in each voxel. Peaks are in
world RAS axes as MRtrix ``sh2peaks`` writes them (``peaks_frame="world"``), or in FSL's
voxel frame as dtifit's V1 and bedpostX's dyads are (``"fsl"``: x negated for images with
a positive-determinant affine, as FSL's bvecs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu import (
    commit,
    commit_device,
    commit_ec,
    commit_host,
    commit_multi,
    commit_operator,
    commit_segments,
    commit_solver,
)
from tractlens.gpu.backend import BackendError, get_backend, gpu_backends
from tractlens.gpu.commit import CommitParams
from tractlens.gpu.commit_operator import Problem
from tractlens.gpu.engines import decide_device

__all__ = [
    "COMMIT_OUTPUTS",
    "PEAKS_FRAMES",
    "WEIGHT_SCALAR",
    "CommitParams",
    "CommitResult",
    "commit_pipeline",
    "existing_outputs",
    "kept_streamlines",
    "output_names",
    "peaks_compartments",
    "tractogram_suffix",
    "weighted_tractogram",
    "write_commit_outputs",
    "write_kept_streamlines",
]

from .. import memory_guard
from ..errors import InputError
from ..io import save_tractogram, save_volume
from ..io._atomic import atomic_path
from ..io.dwi import DWI
from ..io.tractogram import TRACTOGRAM_SUFFIXES
from ..io.tractogram_stream import open_tractogram_writer
from ..memory_guard import check_commit_memory
from ..model import Tractogram
from ..provenance import write_json_summary
from ._fallback import run_with_cpu_fallback
from .commit_inputs import (
    PEAKS_FRAMES,
    _finite_voxels,
    _normalised_signal,
    _segments_fit_on_device,
    peaks_compartments,
)

#: Files written by :func:`write_commit_outputs` ({ext}: the input tractogram's format).
COMMIT_OUTPUTS = {
    "streamline_weights.txt": "one weight per input streamline, in its order (0: filtered out)",
    "tractogram_filtered{ext}": "the streamlines with weight > 0, their weight as the per-streamline scalar commit_weight",
    "fit_RMSE.nii.gz": "per voxel, root mean square of measured − modelled signal (both / mean b=0)",
    "fit_NRMSE.nii.gz": "RMSE divided by the root mean square of the measured signal",
    "compartment_IC.nii.gz": "per voxel, the streamlines' share of the b=0 signal: Σ weight × length in the voxel",
    "compartment_EC.nii.gz": "per voxel, the extra-cellular share of the b=0 signal",
    "compartment_ISO.nii.gz": "per voxel, the isotropic share of the b=0 signal",
    "commit.json": "summary: parameters, sizes, iterations, objective, timings, device",
}


#: Bytes of float64 signal per block of voxel rows when the fit's error maps are computed.
MAP_BLOCK_BYTES = memory_guard.MAP_BLOCK_BYTES
#: A x larger than this stays on the GPU that computed it (its error maps made there); on the
#: CPU with the fused loops it is not made whole (its error maps from blocks of rows)
MODEL_HOST_BYTES = commit_host.MODEL_HOST_BYTES
#: Input points per part when a filtered tractogram is written (12 MB of float32 positions).
WRITE_PART_POINTS = 1 << 20


def fit_errors(y, model, block_rows: int | None = None, xp=np) -> tuple:
    """RMSE and NRMSE per row of measured ``y`` and modelled ``model`` (n_rows, M), ``block_rows``
    rows at a time (default: about :data:`MAP_BLOCK_BYTES` of float64 signal), in ``xp``."""
    n_rows, n_meas = y.shape
    step = block_rows or max(1, MAP_BLOCK_BYTES // (8 * max(n_meas, 1)))
    if xp is not np:
        step *= 64  # device memory is fast and the blocks many
    rmse, norm = xp.empty(n_rows), xp.empty(n_rows)
    for start in range(0, n_rows, step):
        block = slice(start, start + step)
        measured = xp.asarray(y[block], dtype=xp.float64)
        residual = model[block] - measured
        rmse[block] = xp.sqrt((residual**2).mean(1))
        norm[block] = xp.sqrt((measured**2).mean(1))
    nrmse = xp.where(norm > 0, rmse / xp.where(norm > 0, norm, 1.0), 0.0)
    return rmse, nrmse


def fused_fit(op, fit_dtype) -> bool:
    """Whether the fit runs :func:`gpu.commit_solver.fista_fused`: the CPU operator with its
    compiled loops and float32 measurement vectors."""
    return isinstance(op, commit_host.HostOperator) and op.compiled and np.dtype(fit_dtype) == np.float32


def host_fit_errors(op, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RMSE and NRMSE per row of the fit ``x`` against ``y`` (n_rows, M), A x made a block of
    rows at a time (:meth:`gpu.commit_host.HostOperator.a_rows`): the values of
    :func:`fit_errors` on the whole A x, bit for bit, with :data:`MAP_BLOCK_BYTES` of it at once
    per thread."""
    from tractlens.gpu.host import run_parallel

    n_rows, n_meas = y.shape
    step = max(1, MAP_BLOCK_BYTES // (8 * max(n_meas, 1)))
    rmse, nrmse = np.empty(n_rows), np.empty(n_rows)

    def block(r0: int):
        def run():
            r1 = min(n_rows, r0 + step)
            e, n = fit_errors(y[r0:r1], op.a_rows(x, r0, r1))
            rmse[r0:r1], nrmse[r0:r1] = e, n

        return run

    run_parallel([block(r0) for r0 in range(0, n_rows, step)], op.threads)
    return rmse, nrmse


@dataclass
class CommitResult:
    """The fit and what it was made of (host arrays)."""

    problem: Problem
    weights: np.ndarray  # (n_streamlines,): the sum of each streamline's IC columns
    x: np.ndarray  # all columns
    y: np.ndarray  # (n_rows, M) measured (normalised), in the DWI's precision (float32 for float32 data)
    #: (n_rows, M) A x; None when the fit ran on a GPU and A x is larger than
    #: :data:`MODEL_HOST_BYTES`: the error maps were made on the device (``errors``) instead
    model: np.ndarray | None
    rows: np.ndarray  # (X, Y, Z) row of each voxel, -1 outside the mask
    affine: np.ndarray
    tractogram: Tractogram
    fit: commit_solver.FitResult
    params: CommitParams
    provenance: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    errors: tuple[np.ndarray, np.ndarray] | None = None  # (RMSE, NRMSE) per row, when model is None

    def volume(self, per_row: np.ndarray) -> np.ndarray:
        out = np.zeros(self.rows.shape, dtype=np.float32)
        inside = self.rows >= 0
        out[inside] = per_row[self.rows[inside]]
        return out

    def fit_errors(self, block_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """RMSE and NRMSE per voxel row, ``block_rows`` rows at a time (default: about
        :data:`MAP_BLOCK_BYTES` of float64 signal): no (n_rows, M) temporary. Each row's mean is
        the same reduction over its own measurements as over all rows at once, so bit for bit.
        Without a host model, the errors the fit made on the device."""
        if self.model is None:
            return self.errors
        return fit_errors(self.y, self.model, block_rows)

    def maps(self) -> dict[str, np.ndarray]:
        """fit_RMSE, fit_NRMSE and the IC / EC / ISO compartment maps as volumes."""
        rmse, nrmse = self.fit_errors()
        p = self.problem
        ic_x, ec_x, iso_x = p.split(self.x)
        seg = p.segments
        ic = commit_operator.ic_per_row(seg, ic_x.sum(0), p.n_rows)
        ec = np.bincount(p.ec_row, weights=ec_x, minlength=p.n_rows)
        iso = iso_x.sum(1)
        return {
            "fit_RMSE": self.volume(rmse),
            "fit_NRMSE": self.volume(nrmse),
            "compartment_IC": self.volume(ic),
            "compartment_EC": self.volume(ec),
            "compartment_ISO": self.volume(iso),
        }

    def summary(self) -> dict:
        kept = int((self.weights > 0).sum())
        return {
            "streamlines": len(self.weights),
            "kept": kept,
            "filtered_out": len(self.weights) - kept,
            "voxels": self.problem.n_rows,
            "segments": len(self.problem.segments),
            "ec_compartments": self.problem.n_ec,
            "measurements": self.problem.n_meas,
            "iterations": self.fit.iterations,
            "stopped": self.fit.stopped,
            "objective": self.fit.objective[-1] if self.fit.objective else None,
            "params": asdict(self.params),
            "notes": self.notes,
            **self.provenance,
        }


def commit_pipeline(
    dwi: DWI,
    tractogram: Tractogram,
    *,
    mask: np.ndarray | None = None,
    peaks: str | os.PathLike | None = None,
    peaks_frame: str = "world",
    params: CommitParams | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    max_block_segments: int | None = None,
    gpus: int = 1,
    fit_dtype=None,
) -> CommitResult:
    """Fit COMMIT to ``dwi`` with the streamlines of ``tractogram``. ``max_block_segments``:
    apply A and Aᵀ in blocks of voxel rows of at most that many segments (done by itself on
    the GPU when the problem does not fit in its free memory; on the CPU when even the
    smallest blocks do not fit and ``device`` is ``"auto"``). ``gpus`` > 1: A split by voxel
    rows over the first that many GPUs (:mod:`gpu.commit_multi`; no CPU fallback).
    ``fit_dtype``: the type of FISTA's measurement-sized vectors (the signal, A x, A z);
    default :data:`gpu.commit_host.CPU_FIT_DTYPE` on the CPU engine (a third of float64's memory with the
    float32 signal kept as it is; the weights within ~1e-6 relative of float64's: see
    tests/test_commit_cpu.py), float64 on a GPU. Sums are float64 either way."""
    fallback: list[str] = []
    backends = _commit_gpus(gpus, device)
    max_iter = (params or CommitParams()).max_iter
    choice = decide_device("commit", len(tractogram.points) * max_iter, requested=device)  # segments ≈ points
    device = choice.argument
    result = run_with_cpu_fallback(
        lambda backend: _commit_pipeline(
            dwi,
            tractogram,
            mask,
            peaks,
            peaks_frame,
            params,
            backend,
            progress,
            cancelled,
            max_block_segments,
            backends,
            fit_dtype,
        ),
        backends[0] if backends else device,
        fallback,
        "COMMIT filtering",
    )
    result.notes[:0] = fallback
    result.provenance["device_choice"] = choice.reason
    return result


def _commit_gpus(gpus: int, device: str) -> list | None:
    """The GPUs of ``commit --gpus N`` (None for one device), refused as the user can fix it."""
    if gpus < 1:
        raise InputError(f"--gpus must be at least 1, got {gpus}", fix="Give how many GPUs to use, e.g. --gpus 2")
    if gpus == 1:
        return None
    if device == "cpu":
        raise InputError("--gpus with --device cpu", fix="Leave out --device cpu, or --gpus")
    try:
        return gpu_backends(gpus)
    except BackendError as exc:
        raise InputError(str(exc), fix="Give --gpus at most the number of GPUs here (tractlens info)") from None


def _commit_pipeline(
    dwi, tractogram, mask, peaks, peaks_frame, params, device, progress, cancelled, max_block_segments, gpus=None,
    fit_dtype=None,
) -> CommitResult:  # fmt: skip
    params = params or CommitParams()
    notes: list[str] = []
    if len(tractogram) == 0:
        raise InputError("the tractogram has no streamlines", fix="Give a non-empty tractogram")
    shape = dwi.shape3
    b0 = dwi.mean_b0()
    mask = np.ones(shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    finite = _finite_voxels(dwi.data) if getattr(dwi, "nonfinite_voxels", None) != 0 else True  # counted at reading
    usable = mask & finite & (b0 > 0)
    if (dropped := int((mask & ~usable).sum())) > 0:
        notes.append(f"{dropped} mask voxel(s) without usable signal (NaN/Inf or no b=0 signal) left out")
    if not usable.any():
        raise InputError("no voxel of the mask has usable signal", fix="Check the mask and the DWI")
    rows = np.full(shape, -1, dtype=np.int64)
    rows[usable] = np.arange(int(usable.sum()))
    backend = get_backend(device)
    voxel_size = np.sqrt((dwi.affine[:3, :3] ** 2).sum(0))
    started = time.perf_counter()
    if getattr(tractogram, "frame", "voxel") == "mm":  # as the file stores them (tractogram_mapped)
        to_voxel = np.linalg.inv(dwi.affine)
    else:
        to_voxel = np.linalg.solve(dwi.affine, tractogram.affine)
    tables = None
    try:
        two_pass = None  # the engine's default: one pass on the host, two on a GPU
        need = None
        if not backend.is_gpu:  # refused before any work when the host cannot hold it (app.memory_guard)
            need = check_commit_memory(dwi, tractogram, rows, voxel_size, to_voxel, params, peaks)
            two_pass = need.plan["two_pass_cut"]  # cut twice where one pass would be the peak
            tables = commit.lookup_tables(dwi.bvals, dwi.bvecs, params)  # made (float64) before the segments
            commit_host.load_loops(tables)  # numba's compiler too, not at the fit's peak
        seg = commit_segments.segments(
            tractogram.points,
            tractogram.offsets,
            rows,
            voxel_size,
            min_length_mm=params.min_segment_mm,
            backend=backend,
            to_voxel=to_voxel,  # per chunk: no copy of the points
            two_pass=two_pass,
            on_device=_segments_fit_on_device(backend, tractogram),
        )
    except commit_segments.NonFinitePoints as exc:
        raise InputError(str(exc), path=getattr(tractogram, "source", None) or None,
                         fix="The file is damaged; write it again") from None  # fmt: skip
    segments_s = time.perf_counter() - started
    if len(seg) == 0:
        raise InputError("no streamline passes through the mask", fix="Check that tractogram and DWI share a space")
    xp = commit_segments.array_module(seg.fiber)  # the segments stay where they were made
    has_segment = xp.zeros(len(tractogram), dtype=bool)
    has_segment[seg.fiber] = True
    missing = len(tractogram) - int(has_segment.sum())
    del has_segment
    if missing:
        notes.append(f"{missing} streamline(s) have no segment in the mask: weight 0")
    # Fit the voxels the streamlines pass through (as dmri-commit does): a voxel without
    # segments has nothing for the streamlines to explain, and its isotropic-only fit would
    # only dilute the stopping test.
    traversed = seg.drop_empty_rows(int(usable.sum()))
    usable[usable] = commit_segments.host_array(traversed)
    rows = np.full(shape, -1, dtype=np.int64)
    rows[usable] = np.arange(int(usable.sum()))
    if tables is None:  # a GPU's job: made here
        tables = commit.lookup_tables(dwi.bvals, dwi.bvecs, params)
    if peaks is not None:
        ec_row, ec_orient = peaks_compartments(peaks, rows, dwi.affine, notes, peaks_frame)
    elif params.ec_orientations:  # the voxel's main orientations (gpu.commit_ec)
        ec_row, ec_orient = commit_ec.ec_main_orientations(seg, params.ec_orientations)
    else:
        ec_row, ec_orient = commit_operator.ec_from_segments(seg)
    n_rows = int(usable.sum())
    if need is not None:  # again with the exact counts, before the fit's arrays (app.memory_guard)
        fit_need = memory_guard.check_commit_fit_memory(
            seg, n_rows, len(ec_row), len(tractogram), len(dwi.bvals), params, peaks, need.parts["runtime"]
        )
        need.parts.update({"announced before the cut": need.total, "fit, counted": fit_need.total})
        need.total = max(need.total, fit_need.total)  # the job's announcement: the larger
    problem = Problem(n_rows, seg, ec_row, ec_orient, tables["ic"], tables["ec"], tables["iso"])
    y = _normalised_signal(dwi.data, b0, usable)  # a read-only mapped series' pages given back
    if gpus:  # split by voxel rows over several GPUs
        op = commit_multi.SplitOperator(gpus, problem, notes=notes)
    elif backend.is_gpu:
        op = commit_device.device_operator(backend, problem, max_segments=max_block_segments, notes=notes)
    elif max_block_segments is not None:
        op = commit_device.BlockedOperator(problem, commit_operator.NumpyOperator, max_block_segments)
    else:  # the segments in place, threads over voxel rows (gpu.commit_host)
        op = commit_host.host_operator(problem, notes=notes)
    xp = backend.xp
    a, at = op.a, op.at
    if fit_dtype is None:
        fit_dtype = xp.float64 if backend.is_gpu else commit_host.CPU_FIT_DTYPE
    if not backend.is_gpu:  # the signal as FISTA takes it, held once (float32 data: no copy)
        y = y.astype(fit_dtype, copy=False)
    y_fit = xp.asarray(y).astype(fit_dtype, copy=False)  # widened on the device: exact (float32 values)
    solve = dict(
        lambda_=params.lambda_,
        n_penalised=problem.n_ic_cols,
        max_iter=params.max_iter,
        tol=params.tol,
        progress=None if progress is None else (lambda it, n, _value: progress(it, n)),
        cancelled=cancelled,
    )
    fused = fused_fit(op, fit_dtype)
    if fused:  # one measurement vector besides the signal (bit for bit fista's iterates)
        fit = commit_solver.fista_fused(op, y_fit, problem.n_cols, scale=op.column_norms(), **solve)
    else:
        fit = commit_solver.fista(
            a,
            at,
            y_fit,
            problem.n_cols,
            scale=op.column_norms(),  # not kept here: FISTA keeps 1/scale only
            dtype=fit_dtype,
            writes_into=getattr(op, "writes_into", False),
            xp=xp,
            **solve,
        )
    x = backend.to_host(fit.x)
    fit.x = x
    errors = None
    if fused and 8 * y.size > MODEL_HOST_BYTES:  # the error maps from A x a block of rows at a time
        errors, model = host_fit_errors(op, x, y), None
    else:
        model_fit = a(xp.asarray(x))
        if backend.is_gpu and model_fit.nbytes > MODEL_HOST_BYTES:  # the error maps made where A x is
            errors = fit_errors(y_fit.reshape(y.shape), model_fit.reshape(y.shape), xp=xp)
            errors, model = tuple(backend.to_host(e) for e in errors), None
        else:
            model = backend.to_host(model_fit).reshape(y.shape)
        del model_fit
    del y_fit
    provenance = {
        "backend": backend.name,
        "device": backend.device_name,
        "fit_s": round(fit.seconds, 3),
        "segments_s": round(segments_s, 3),
        "segments_on": "device" if seg.on_device else "host",
        **({} if backend.is_gpu else {"cut_passes": 2 if two_pass else 1}),
        **({} if need is None else {"host_memory_announced_bytes": need.total, "host_memory_parts": need.parts}),
        "lipschitz": fit.lipschitz,
        "operator_blocks": len(op) if isinstance(op, commit_device.BlockedOperator) else 1,
        "s_per_iteration": round(fit.seconds / max(1, fit.iterations), 5),
        **(op.provenance() if gpus else {}),
    }
    return CommitResult(
        problem,
        problem.split(x)[0].sum(0),
        x,
        y,
        model,
        rows,
        dwi.affine,
        tractogram,
        fit,
        params,
        provenance,
        notes,
        errors,
    )


#: The per-streamline scalar that holds the COMMIT weights on a weighted tractogram.
WEIGHT_SCALAR = "commit_weight"


def output_names(suffix: str) -> list[str]:
    """The files :func:`write_commit_outputs` writes for a tractogram in ``suffix`` format."""
    return [name.format(ext=suffix) for name in COMMIT_OUTPUTS]


def existing_outputs(folder: str | os.PathLike) -> list[str]:
    """The COMMIT output files (the filtered tractogram in any format) already in ``folder``."""

    folder = Path(folder)
    names = {name.format(ext=suffix) for name in COMMIT_OUTPUTS for suffix in TRACTOGRAM_SUFFIXES}
    return sorted(name for name in names if (folder / name).exists())


def tractogram_suffix(*owners) -> str:
    """The format to write a filtered tractogram in: .tck or .trx when one of ``owners`` (a
    tractogram, a layer) records a ``source`` file of that format, otherwise .trk."""
    for owner in owners:
        source = str(getattr(owner, "source", "") or "")
        for suffix in (".tck", ".trx"):
            if source.lower().endswith(suffix):
                return suffix
    return ".trk"


def weighted_tractogram(tract: Tractogram, weights: np.ndarray, name: str) -> Tractogram:
    """``tract`` (its arrays shared) with the COMMIT ``weights`` as :data:`WEIGHT_SCALAR`."""
    return Tractogram(
        tract.points,
        tract.offsets,
        tract.affine,
        tract.dimensions,
        dict(tract.point_scalars),
        {**tract.streamline_scalars, WEIGHT_SCALAR: np.asarray(weights, dtype=np.float64)},
        name=name,
    )


def kept_streamlines(tract: Tractogram, keep: np.ndarray) -> Tractogram:
    """``tract.subset(keep)`` for a boolean ``keep`` per streamline, through a boolean mask of
    the points (one byte a point) rather than int64 point indices: only the kept points are
    copied (a whole-brain tractogram has hundreds of millions)."""
    keep = np.asarray(keep, dtype=bool)
    lengths = tract.lengths
    point_keep = np.repeat(keep, lengths)
    return Tractogram(
        tract.points[point_keep],
        np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64),
        tract.affine,
        tract.dimensions,
        {k: np.asarray(v)[point_keep] for k, v in tract.point_scalars.items()},
        {k: np.asarray(v)[keep] for k, v in tract.streamline_scalars.items()},
        name=tract.name,
    )


def write_kept_streamlines(
    tract: Tractogram,
    keep: np.ndarray,
    weights: np.ndarray,
    path: str | os.PathLike,
    *,
    part_points: int | None = None,
) -> Path:
    """Write the streamlines of ``tract`` where ``keep`` holds, each with its value of ``weights``
    (one per streamline of ``tract``) as the float32 scalar :data:`WEIGHT_SCALAR`: the bytes of
    ``save_tractogram`` of :func:`kept_streamlines` with those weights, written through the
    streaming writer in parts of about ``part_points`` input points (:data:`WRITE_PART_POINTS`),
    so neither a copy of the kept points nor their world coordinates are ever held whole."""
    keep = np.asarray(keep, dtype=bool)
    weights = np.asarray(weights)
    if not keep.any():  # the empty file, as save_tractogram writes it (nothing to hold)
        empty = kept_streamlines(tract, keep)
        empty.streamline_scalars[WEIGHT_SCALAR] = weights[keep].astype(np.float32)
        return save_tractogram(empty, path)
    step = part_points or WRITE_PART_POINTS
    # the writer's thread writes a part while the next is gathered; two parts queued at most
    in_mm = getattr(tract, "frame", "voxel") == "mm"  # points as the file stored them: written as they are
    with open_tractogram_writer(
        path, tract.affine, tract.dimensions, background=True, queued_points=2 * step, points_in_mm=in_mm
    ) as out:
        for first, last in _streamline_parts(tract.offsets, step):
            out.append(_kept_part(tract, keep, weights, first, last))
    return out.path


def _streamline_parts(offsets: np.ndarray, points_per_part: int):
    """(first, last) streamline ranges of at most ``points_per_part`` points (or one streamline)."""
    n = len(offsets) - 1
    first = 0
    while first < n:
        last = int(np.searchsorted(offsets, offsets[first] + points_per_part, side="right")) - 1
        last = min(max(last, first + 1), n)
        yield first, last
        first = last


def _kept_part(tract: Tractogram, keep: np.ndarray, weights: np.ndarray, first: int, last: int) -> Tractogram:
    """Streamlines ``first:last`` of ``tract`` where ``keep`` holds, with their weights (views
    of ``tract``'s arrays when all are kept)."""
    chosen = keep[first:last]
    start, stop = int(tract.offsets[first]), int(tract.offsets[last])
    lengths = np.diff(tract.offsets[first : last + 1])
    point_keep = None if chosen.all() else np.repeat(chosen, lengths)

    def kept_points(values) -> np.ndarray:
        values = np.asarray(values[start:stop])
        return values if point_keep is None else np.compress(point_keep, values, axis=0)  # 4× a boolean index

    per_streamline = {k: np.asarray(v)[first:last][chosen] for k, v in tract.streamline_scalars.items()}
    per_streamline[WEIGHT_SCALAR] = weights[first:last][chosen].astype(np.float32)
    return Tractogram(
        kept_points(tract.points),
        np.concatenate([[0], np.cumsum(lengths[chosen])]).astype(np.int64),
        tract.affine,
        tract.dimensions,
        {k: kept_points(v) for k, v in tract.point_scalars.items()},
        per_streamline,
        name=tract.name,
    )


def write_commit_outputs(result: CommitResult, outdir: str | os.PathLike, tractogram_suffix: str = ".trk") -> dict:
    """Write :data:`COMMIT_OUTPUTS` into ``outdir`` (atomic per file)."""
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise InputError("the output path exists and is not a folder", path=out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    with atomic_path(out / "streamline_weights.txt") as tmp:
        np.savetxt(tmp, result.weights, fmt="%.9g")
    files["streamline_weights.txt"] = out / "streamline_weights.txt"
    name = f"tractogram_filtered{tractogram_suffix}"
    files[name] = write_kept_streamlines(result.tractogram, result.weights > 0, result.weights, out / name)
    for key, volume in result.maps().items():
        files[f"{key}.nii.gz"] = save_volume(volume, result.affine, out / f"{key}.nii.gz")
    files["commit.json"] = write_json_summary(
        result.summary(),
        out / "commit.json",
        inputs=[result.tractogram.source or None],
        call=("tractlens.write_commit_outputs", "<result>", outdir),
    )
    return {k: str(v) for k, v in files.items()}
