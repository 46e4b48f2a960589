"""Use case: probtrackx2's connectome modes from a bedpostX folder — ``--omatrix2 --target2``,
``--omatrix3 --target3 [--lrtarget3]``, ``--network``, with ``--distthresh``, ``--pd`` and
``--ompl`` — written as FSL writes them (:mod:`app.io.fsl_matrix`).

The definitions are FSL's (see :mod:`gpu.connectome`). Grids: target3 is brought onto the
samples' grid like the other masks (nearest neighbour, with a notice); target2 and
lrtarget3 keep their own (usually coarser) grid, as in FSL: a samples voxel belongs to the
target voxel its centre falls in. Matrix rows and columns are numbered in FSL's voxel order
(x fastest), so ``coords_for_fdt_matrix*`` list the same voxels FSL would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu.backend import BackendError, gpu_backends
from tractlens.gpu.connectome import ConnectomeResult, ConnectomeSpec, track_connectome
from tractlens.gpu.connectome_counts import SparseCounts
from tractlens.gpu.connectome_split import track_connectome_split

from ..errors import InputError
from ..io import load_bedpostx, save_volume
from ..io._atomic import write_text_atomic
from ..io.fsl_matrix import (
    fsl_voxel_order,
    write_ascii_matrix,
    write_coords,
    write_fdt_matrix,
    write_npz_matrix,
    write_probtrackx_log,
)
from ..io.nifti import load_3d, load_image
from ..params import ProbOutputParams
from ..timing import phase
from .probabilistic import ProbabilisticRun, ProbParams, prepare_probabilistic_masks
from .select import load_masks_on_reference
from .warmup import join_background_warmup


@dataclass
class LowResTarget:
    """A target on its own grid (target2, lrtarget3): its voxels in FSL order and the column of
    each samples voxel."""

    affine: np.ndarray
    shape: tuple[int, int, int]
    coords: np.ndarray  # (n, 3) its voxels, FSL order: column c is coords[c]
    columns: np.ndarray  # (X, Y, Z) on the samples' grid, −1 outside

    def lookup(self) -> np.ndarray:
        """lookup_tractspace volume: 1-based column of each target voxel, 0 elsewhere."""
        volume = np.zeros(self.shape, dtype=np.int32)
        volume[tuple(self.coords.T)] = np.arange(1, len(self.coords) + 1)
        return volume


@dataclass
class ConnectomeRun:
    """A prepared connectome run: the probabilistic run (field, masks, seeds), what to count."""

    prob: ProbabilisticRun
    spec: ConnectomeSpec
    options: ProbOutputParams
    target2: LowResTarget | None = None
    target3_coords: np.ndarray | None = None
    lrtarget3: LowResTarget | None = None
    network_names: list[str] = field(default_factory=list)

    def track(
        self,
        *,
        device: str = "auto",
        chunk: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
        gpus: int = 1,
        backends=None,
    ) -> ConnectomeResult:
        """Count the modes; ``gpus`` > 1 shares the streamlines out over the first that many GPUs
        of this host (:mod:`gpu.connectome_split`: the same counts as on one; a GPU that fails is
        named). ``backends`` replaces those GPUs (tests: simulated GPUs)."""
        p = self.prob
        options = dict(distthresh=self.options.distthresh, distthresh3=self.options.distthresh3,
                       lengths=self.options.pd or self.options.ompl, n_waypoints=p.n_waypoints, chunk=chunk,
                       progress=progress, cancelled=cancelled)  # fmt: skip
        if gpus > 1 or backends is not None:
            try:
                backends = backends or gpu_backends(gpus)
            except BackendError as exc:
                raise InputError(str(exc), fix="Give --gpus at most the number of GPUs here (tractlens info)") from None
            result = track_connectome_split(p.field, p.bits, p.seeds, p.params, self.spec, backends, **options)
            p.notes.extend(result.provenance.pop("notes", []))
            return result
        return track_connectome(p.field, p.bits, p.seeds, p.params, self.spec, device=device, **options)


def wants_connectome(options: ProbOutputParams, *masks) -> bool:
    """Whether a probabilistic run needs the connectome path: a mode, a path-length option,
    or one of the modes' masks (given alone, it is refused there with the fix)."""
    o = options
    flags = o.omatrix2 or o.omatrix3 or o.network or o.pd or o.ompl or o.distthresh > 0 or o.distthresh3 > 0
    return bool(flags or any(masks))


def check_connectome_options(options: ProbOutputParams, target2, target3, lrtarget3) -> None:
    """The mode flags and their masks go together, as probtrackx2 requires."""
    pairs = (
        ("--omatrix2", options.omatrix2, "--target2", target2),
        ("--omatrix3", options.omatrix3, "--target3", target3),
    )
    for mode, on, mask, given in pairs:
        if on and not given:
            raise InputError(f"{mode} needs {mask} MASK", fix=f"Give {mask} (the matrix's column space)")
        if given and not on:
            raise InputError(f"{mask} is only used with {mode}", fix=f"Add {mode}, or drop {mask}")
    if options.network and options.omatrix2:
        raise InputError(
            "--omatrix2 rows are the seed voxels of one seed mask, not of a --network list",
            fix="Run --network and --omatrix2 separately",
        )
    if lrtarget3 and not options.omatrix3:
        raise InputError("--lrtarget3 is only used with --omatrix3", fix="Add --omatrix3 --target3 MASK")


def read_network_list(path: str | os.PathLike) -> list[Path]:
    """The masks a ``--network`` seed file lists (one per line; relative to the working folder,
    else to the list's folder)."""
    path = Path(path)
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the list of network masks: {exc}", path=path) from None
    names = [line for line in lines if line and not line.startswith("#")]
    if len(names) < 2:
        raise InputError(
            "--network needs a text file listing at least two masks, one per line",
            path=path,
            fix="List the region masks (NIfTI) in a text file and give it as --seed",
        )
    found = []
    for name in names:
        candidate = Path(name)
        if not candidate.exists() and not candidate.is_absolute() and (path.parent / candidate).exists():
            candidate = path.parent / candidate
        if not candidate.exists():
            raise InputError(f"the network mask {name} does not exist", path=path, fix="Correct the list")
        found.append(candidate)
    return found


def _low_res_target(path, what: str, samples_affine, samples_shape) -> LowResTarget:
    with phase("read"):
        img = load_image(path, what)
        data = np.asarray(load_3d(path, None, what))
    mask = (data != 0) & np.isfinite(data)
    if not mask.any():
        raise InputError(f"the {what} is empty (no non-zero voxel)", path=path, fix="Give a non-empty mask")
    coords = fsl_voxel_order(mask)
    number = np.full(mask.shape, -1, dtype=np.int64)
    number[tuple(coords.T)] = np.arange(len(coords))
    ijk = np.indices(samples_shape).reshape(3, -1)
    to_target = np.linalg.inv(img.affine) @ samples_affine
    v = np.rint(to_target[:3, :3] @ ijk + to_target[:3, 3:]).astype(np.int64)
    inside = np.all((v >= 0) & (v < np.array(mask.shape)[:, None]), axis=0)
    columns = np.full(ijk.shape[1], -1, dtype=np.int64)
    columns[inside] = number[tuple(v[:, inside])]
    if not (columns >= 0).any():
        raise InputError(f"the {what} does not overlap the samples' volume", path=path)
    return LowResTarget(img.affine, mask.shape, coords, columns.reshape(samples_shape))


def prepare_connectome(
    samples_dir: str | os.PathLike,
    seed: str | os.PathLike,
    *,
    options: ProbOutputParams,
    target2: str | os.PathLike | None = None,
    target3: str | os.PathLike | None = None,
    lrtarget3: str | os.PathLike | None = None,
    waypoints: Sequence[str | os.PathLike] = (),
    exclude: str | os.PathLike | None = None,
    stop: str | os.PathLike | None = None,
    params: ProbParams | None = None,
) -> ConnectomeRun:
    """Load the bedpostX folder and the masks, check them, and build the engine's inputs."""
    check_connectome_options(options, target2, target3, lrtarget3)
    with phase("read"):
        samples = load_bedpostx(samples_dir)
    notes: list[str] = []
    grid = (samples.affine, samples.mask.shape)

    def masks(paths, what):
        return load_masks_on_reference(list(paths), what, *grid, notes) if paths else []

    network_paths = read_network_list(seed) if options.network else []
    seed_masks = masks(network_paths or [seed], "seed mask")
    union = np.logical_or.reduce(seed_masks)
    prob = prepare_probabilistic_masks(
        samples,
        union,
        waypoints=masks(waypoints, "waypoint mask"),
        exclude=masks([exclude], "exclusion mask")[0] if exclude else None,
        stop=masks([stop], "stop mask")[0] if stop else None,
        params=params,
        notes=notes,
        seed_name=str(seed),
    )
    spec = ConnectomeSpec()
    run = ConnectomeRun(prob, spec, options, network_names=[str(p) for p in network_paths])
    if options.network:  # each mask seeded on its own: a voxel in two masks is seeded twice
        per_mask = [np.ascontiguousarray(np.argwhere(m)) for m in seed_masks]
        prob.seeds = np.concatenate(per_mask)
        spec.network_masks = np.stack(seed_masks)
        spec.seed_mask_of_seed = np.repeat(np.arange(len(per_mask)), [len(s) for s in per_mask])
    if options.omatrix2:
        run.target2 = _low_res_target(target2, "target2 mask", *grid)
        spec.matrix2_columns, spec.n_matrix2_columns = run.target2.columns, len(run.target2.coords)
    if options.omatrix3:
        mask3 = masks([target3], "target3 mask")[0]
        run.target3_coords = fsl_voxel_order(mask3)
        nodes = np.full(mask3.shape, -1, dtype=np.int64)
        nodes[tuple(run.target3_coords.T)] = np.arange(len(run.target3_coords))
        spec.matrix3_nodes, spec.n_matrix3_nodes = nodes, len(run.target3_coords)
        if lrtarget3:
            run.lrtarget3 = _low_res_target(lrtarget3, "lrtarget3 mask", *grid)
            spec.matrix3_columns, spec.n_matrix3_columns = run.lrtarget3.columns, len(run.lrtarget3.coords)
    join_background_warmup()
    return run


def _write_matrix(files: dict, out: Path, name: str, counts: SparseCounts, rows, options: ProbOutputParams) -> None:
    """fdt_matrixN.dot (counts, or summed lengths with --pd) and with --ompl its _lengths twin,
    in the formats asked for; ``rows`` renumbers the rows (FSL's seed order) or is None."""
    r = counts.rows if rows is None else rows[counts.rows]
    values = counts.lengths_mm if options.pd else counts.counts
    tables = [(name, values)]
    if options.ompl:
        tables.append((f"{name}_lengths", counts.lengths_mm / np.maximum(counts.counts, 1)))
    for stem, v in tables:
        if options.matrix_format in ("dot", "both"):
            files[f"{stem}.dot"] = write_fdt_matrix(out / f"{stem}.dot", r, counts.cols, v, counts.shape)
        if options.matrix_format in ("npz", "both"):
            files[f"{stem}.npz"] = write_npz_matrix(out / f"{stem}.npz", r, counts.cols, v, counts.shape)


def write_connectome_outputs(
    run: ConnectomeRun, result: ConnectomeResult, outdir: str | os.PathLike, *, argv: Sequence[str] = ()
) -> dict[str, str]:
    """Write FSL's files for the modes run (atomic per file); returns name → path."""
    out = Path(outdir)
    if out.exists() and not out.is_dir():
        raise InputError("the output path exists and is not a folder", path=out)
    out.mkdir(parents=True, exist_ok=True)
    o, aff = run.options, run.prob.samples.affine
    files: dict[str, Path] = {"probtrackx.log": write_probtrackx_log(out / "probtrackx.log", list(argv))}
    fdt = result.paths_lengths_mm if o.pd else result.paths
    files["fdt_paths.nii.gz"] = save_volume(fdt.astype(np.float32), aff, out / "fdt_paths.nii.gz")
    if o.ompl:
        mean = result.paths_lengths_mm / np.maximum(result.paths, 1)
        files["fdt_paths_lengths.nii.gz"] = save_volume(mean.astype(np.float32), aff, out / "fdt_paths_lengths.nii.gz")
    files["waytotal"] = write_ascii_matrix(out / "waytotal", result.waytotal[:, None])
    if result.matrix2 is not None:
        fsl_rows = fsl_row_numbers(run.prob.seeds)
        _write_matrix(files, out, "fdt_matrix2", result.matrix2, fsl_rows, o)
        files["coords_for_fdt_matrix2"] = write_coords(out / "coords_for_fdt_matrix2", _fsl_sorted(run.prob.seeds))
        files["tract_space_coords_for_fdt_matrix2"] = write_coords(
            out / "tract_space_coords_for_fdt_matrix2", run.target2.coords, five_columns=False
        )
        files["lookup_tractspace_fdt_matrix2.nii.gz"] = save_volume(
            run.target2.lookup(), run.target2.affine, out / "lookup_tractspace_fdt_matrix2.nii.gz", dtype=np.int32
        )
    if result.matrix3 is not None:
        _write_matrix(files, out, "fdt_matrix3", result.matrix3, None, o)
        files["coords_for_fdt_matrix3"] = write_coords(out / "coords_for_fdt_matrix3", run.target3_coords)
        if run.lrtarget3 is not None:
            files["tract_space_coords_for_fdt_matrix3"] = write_coords(
                out / "tract_space_coords_for_fdt_matrix3", run.lrtarget3.coords
            )
    if result.network is not None:
        net = result.network
        dense = net.dense() if not o.pd else _dense(net, net.lengths_mm)
        files["fdt_network_matrix"] = write_ascii_matrix(out / "fdt_network_matrix", dense)
        if o.ompl:
            mean = _dense(net, net.lengths_mm / np.maximum(net.counts, 1))
            files["fdt_network_matrix_lengths"] = write_ascii_matrix(out / "fdt_network_matrix_lengths", mean)
    summary = summarise_connectome(run, result)
    files["probtrackx.json"] = write_json(out / "probtrackx.json", summary)
    return {name: str(path) for name, path in files.items()}


def write_json(path: Path, summary: dict) -> Path:
    return write_text_atomic(json.dumps(summary, indent=2, default=str), path)


def _dense(counts: SparseCounts, values) -> np.ndarray:
    out = np.zeros(counts.shape, dtype=np.float64)
    out[counts.rows, counts.cols] = values
    return out


def _fsl_sorted(ijk: np.ndarray) -> np.ndarray:
    ijk = np.asarray(ijk, dtype=np.int64)
    return ijk[np.lexsort((ijk[:, 0], ijk[:, 1], ijk[:, 2]))]


def fsl_row_numbers(seeds: np.ndarray) -> np.ndarray:
    """Each seed's row in FSL's order (z outer, x inner)."""
    seeds = np.asarray(seeds, dtype=np.int64)
    order = np.lexsort((seeds[:, 0], seeds[:, 1], seeds[:, 2]))
    rows = np.empty(len(seeds), dtype=np.int64)
    rows[order] = np.arange(len(seeds))
    return rows


def summarise_connectome(run: ConnectomeRun, result: ConnectomeResult) -> dict:
    modes = {"matrix2": result.matrix2, "matrix3": result.matrix3, "network": result.network}
    return {
        "seed_voxels": len(run.prob.seeds),
        "streamlines": result.streamlines,
        "waytotal": result.waytotal.tolist(),
        "matrices": {name: {"shape": list(m.shape), "nonzeros": m.nnz} for name, m in modes.items() if m is not None},
        "network_masks": run.network_names,
        "options": asdict(run.options),
        "notes": run.prob.notes,
        **result.provenance,
    }
