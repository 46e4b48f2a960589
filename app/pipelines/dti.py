"""Use case: fit diffusion tensors to a DWI series and write the maps.

Shared by the ``tractlens fit-dti`` command, the GUI and Python scripts.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tractlens.gpu import sym3
from tractlens.gpu.dti import FLAG_FIT_FAILED, FLAG_NO_SIGNAL, FLAG_NONFINITE_SIGNAL, DTIFit, DTIFitParams, fit_dti
from tractlens.gpu.engines import decide_device
from tractlens.gpu.host import host_threads

from ..errors import InputError
from ..io import DWI, load_mask, save_volume
from ..io.dwi import require_weighted, x_flip_needed
from ..io.output_set import output_set
from ..io.outputs import check_output_folder
from ..masking import brain_mask_from_b0
from ..model import Volume
from ..provenance import write_json_summary
from ..timing import phase
from ._fallback import run_with_cpu_fallback
from ._fitted import require_fitted
from .warmup import join_background_warmup

log = logging.getLogger(__name__)

#: The file-name prefix of the maps, as dtifit's ``--out`` basename (``dti`` is FSL's habit).
DTI_PREFIX = "dti"

#: Maps written by :func:`write_dti_outputs` (``PREFIX_NAME.nii.gz``), with what each holds. The
#: names are dtifit's, so that fslpy and FSLeyes recognise the folder; AD, RD, RGB, mask and flags
#: are TractLens's additions under the same prefix.
DTI_MAPS = {
    "FA": "fractional anisotropy, 0..1",
    "MD": "mean diffusivity, mm²/s",
    "MO": "mode of anisotropy, -1 (planar) .. 1 (linear), as dtifit",
    "AD": "axial diffusivity λ1, mm²/s",
    "RD": "radial diffusivity (λ2+λ3)/2, mm²/s",
    "RGB": "colour FA |e1|·FA, 3 volumes (R, G, B) in 0..1",
    "tensor": "tensor, 6 volumes in FSL order xx, xy, xz, yy, yz, zz, FSL bvec frame, mm²/s",
    "V1": "main eigenvector e1, 3 volumes, FSL bvec frame (as dtifit)",
    "V2": "second eigenvector e2, 3 volumes, FSL bvec frame",
    "V3": "third eigenvector e3, 3 volumes, FSL bvec frame",
    "L1": "largest eigenvalue, mm²/s",
    "L2": "middle eigenvalue, mm²/s",
    "L3": "smallest eigenvalue, mm²/s",
    "mask": "voxels fitted (given or computed brain mask)",
    "S0": "fitted b=0 signal",
    "flags": "per-voxel fit flags: 1 non-finite signal, 2 no b=0 signal, 4 fit failed, 8 not positive definite",
}


def dti_file_name(name: str, prefix: str = DTI_PREFIX) -> str:
    """The file of map ``name`` (a key of :data:`DTI_MAPS`): ``dti_FA.nii.gz`` by default."""
    return f"{prefix}_{name}.nii.gz"


def check_prefix(prefix: str, folder: str | os.PathLike | None = None) -> str:
    """A usable file-name prefix (dtifit's ``--out`` basename) for ``folder``: not empty, no folder in it."""
    if not prefix or prefix.strip() != prefix or any(c in prefix for c in "/\\") or prefix in (".", ".."):
        raise InputError(
            f"the output prefix {prefix!r} is not a file-name prefix",
            path=folder,
            fix="Give a plain name such as dti (files become dti_FA.nii.gz, ...); the folder goes in -o",
        )
    return prefix


#: The default files, with what each holds (``fit_dti.json`` beside them).
DTI_OUTPUTS = {dti_file_name(name): text for name, text in DTI_MAPS.items()}

#: The unit of the diffusivities (b-values in s/mm²), and the scalar maps that carry it.
DIFFUSIVITY_UNIT = "mm²/s"
MAP_UNITS = {
    name: DIFFUSIVITY_UNIT for name, text in DTI_MAPS.items() if text.endswith(DIFFUSIVITY_UNIT) and name != "tensor"
}


@dataclass
class DTIResult:
    """Maps on the DWI grid (host arrays) plus the fit's provenance and notes."""

    affine: np.ndarray
    mask: np.ndarray
    fit: DTIFit
    shape: tuple[int, int, int]
    mask_source: str
    warnings: list[str] = field(default_factory=list)
    #: The files the fit read (DWI, gradients, mask), for the summary's provenance.
    inputs: list[str] = field(default_factory=list)

    def _scatter(self, values: np.ndarray) -> np.ndarray:
        out = np.zeros(self.shape + values.shape[1:], dtype=np.float32)
        out[self.mask] = values
        return out

    def map(self, name: str) -> np.ndarray:
        """A map as a full (X, Y, Z[, k]) float32 array; name is fa, md, ad, rd, rgb, s0, flags,
        tensor (internal order, voxel axes), v1, v2, v3, l1, l2, l3, mo."""
        fit = self.fit
        source = {
            "fa": fit.fa,
            "md": fit.md,
            "ad": fit.ad,
            "rd": fit.rd,
            "rgb": fit.rgb,
            "s0": fit.s0,
            "flags": fit.flags,
            "tensor": fit.tensor,
            "v1": fit.evecs[:, :, 0],
            "v2": fit.evecs[:, :, 1],
            "v3": fit.evecs[:, :, 2],
            "mo": mode_of_anisotropy(fit.evals),
            "l1": fit.evals[:, 0],
            "l2": fit.evals[:, 1],
            "l3": fit.evals[:, 2],
        }[name]
        return self._scatter(source)

    def volumes(self) -> dict[str, Volume]:
        """The maps as model volumes (for the GUI document)."""
        kinds = {"fa": "scalar", "md": "scalar", "rgb": "rgb", "tensor": "tensor", "v1": "vector"}
        return {
            name.upper(): Volume(name.upper(), self.map(name), self.affine, kind=kind) for name, kind in kinds.items()
        }

    def summary(self) -> dict:
        in_mask = self.fit.flags == 0
        return {
            "voxels_fitted": int(self.mask.sum()),
            "mask": self.mask_source,
            "flags": self.fit.flag_counts(),
            "fa_mean": float(self.fit.fa[in_mask].mean()) if in_mask.any() else None,
            "md_mean": float(self.fit.md[in_mask].mean()) if in_mask.any() else None,
            "warnings": self.warnings,
            **self.fit.provenance,
        }


def mode_of_anisotropy(evals: np.ndarray) -> np.ndarray:
    """dtifit's MO from eigenvalues (N, 3): the mode of the deviatoric tensor (Ennis & Kindlmann,
    MRM 2006), ``3·√6·det(Ã/‖Ã‖)`` with ``Ã = D - MD·I``, i.e. ``3√6·ẽ1ẽ2ẽ3/‖ẽ‖³`` for
    ``ẽi = λi - MD``; -1 planar, 0 orthotropic, 1 linear; 0 where the tensor is isotropic."""
    evals = np.asarray(evals, dtype=np.float64)  # the fit's host arrays; float64: a cube of small numbers
    dev = evals - evals.mean(axis=1, keepdims=True)
    norm = np.sqrt((dev * dev).sum(axis=1))
    product = dev[:, 0] * dev[:, 1] * dev[:, 2]
    safe = np.where(norm > 0, norm, 1.0)
    mode = np.where(norm > 0, 3.0 * np.sqrt(6.0) * product / safe**3, 0.0)
    return np.clip(mode, -1.0, 1.0).astype(np.float32)


def masked_signal(data: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, K) signals of the voxels in ``mask`` (in ``data[mask]`` order).

    NIfTI data arrive column-major (each volume contiguous); gathering volume by
    volume with flat indices reads memory in order, several times faster than
    ``data[mask]`` there, and the volumes are gathered by a pool of threads (``np.take``
    releases the GIL; on a memory-mapped file the pages are read in parallel too). The
    result is gathered once, straight into its final (K, N) array, and returned as its
    column-major (N, K) view, which the engine sends to the device as it is and
    transposes there.
    """
    if not data.flags.f_contiguous or data.ndim != 4:
        return data[mask]
    index = np.ravel_multi_index(np.nonzero(mask), mask.shape, order="F")
    out = np.empty((data.shape[3], index.size), dtype=data.dtype)

    def gather(k: int) -> None:
        np.take(data[..., k].ravel(order="F"), index, out=out[k])

    workers = min(8, host_threads(), data.shape[3])
    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(gather, range(data.shape[3])):
                pass
    else:
        for k in range(data.shape[3]):
            gather(k)
    return out.T


def resolve_mask(
    dwi: DWI, mask_path: str | os.PathLike | None, device="cpu", notes: list[str] | None = None
) -> tuple[np.ndarray, str]:
    """The user's mask (checked against the DWI grid) or one computed from b=0, its median filter
    on the GPU where the fit's device would be the GPU for the whole volume (see
    :func:`mask_device`); a GPU out of memory under ``"auto"`` adds a note to ``notes`` and
    filters on the CPU (the same mask)."""
    if mask_path is not None:
        with phase("read"):
            return load_mask(mask_path, dwi.as_volume(), what="mask"), str(mask_path)
    mean_b0 = dwi.mean_b0()
    on_gpu = mask_device(dwi, device)
    if on_gpu is None:
        mask = brain_mask_from_b0(mean_b0)
    else:  # out of memory: "auto" (or a backend) filters on the CPU with a note, "gpu" reports it
        mask = run_with_cpu_fallback(
            lambda backend: brain_mask_from_b0(mean_b0, backend=backend),
            on_gpu,
            notes if notes is not None else [],
            "the brain mask's median filter",
            batched=False,
        )
    if not mask.any():
        raise InputError(
            "no brain found in the b=0 image (the automatic mask is empty)",
            path=dwi.path,
            fix="Pass a brain mask with --mask",
        )
    return mask, "computed from b=0 (median filter, Otsu threshold, largest component)"


def mask_device(dwi: DWI, device="cpu"):
    """Where the automatic mask's median filter runs: None for the host, else the device to
    resolve (``"auto"``, ``"gpu"`` or a backend).

    ``"cpu"``: the host; ``"gpu"`` or a GPU backend: the GPU; ``"auto"``: the GPU when the cost
    model would fit the whole volume's tensors there (a GPU usable and its start-up repaid),
    which is the fit's own choice for any brain-sized mask."""
    if isinstance(device, str) and device.lower() == "cpu":
        return None
    if device == "auto":
        join_background_warmup()  # the choice sees the start-up paid in the background, as the fit's
    choice = decide_device("fit-dti", dwi.data.size, requested=device)
    return choice.argument if choice.device == "gpu" else None


def choose_mask(
    dwi: DWI,
    mask: np.ndarray | None,
    mask_path: str | os.PathLike | None,
    device="cpu",
    notes: list[str] | None = None,
) -> tuple[np.ndarray, str]:
    """The given mask array (checked), else :func:`resolve_mask` (on ``device``); with a note on
    its source."""
    if mask is None:
        return resolve_mask(dwi, mask_path, device, notes)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != dwi.shape3:
        raise InputError(
            f"the mask has shape {mask.shape} but the data {dwi.shape3}",
            path=dwi.path or None,
            fix="Use a mask drawn on (or resampled to) this diffusion series' grid",
        )
    if not mask.any():
        raise InputError("the mask is empty", path=dwi.path or None, fix="Give a mask with at least one voxel")
    return mask, "given"


def fit_dti_pipeline(
    dwi: DWI,
    *,
    mask: np.ndarray | None = None,
    mask_path: str | os.PathLike | None = None,
    params: DTIFitParams | None = None,
    device: str = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> DTIResult:
    """Fit tensors inside the mask (given array, file, or computed) of a loaded DWI.

    The use case behind ``tractlens fit-dti`` and the window's fit on open: it chooses the
    device from the job's size, falls back to the CPU when the GPU runs out of memory (saying
    so in ``warnings``), and collects what the fit flagged.

    Parameters
    ----------
    dwi : DWI
        A loaded series (:func:`tractlens.app.io.load_dwi`).
    mask : numpy.ndarray, optional
        (X, Y, Z) bool: the voxels to fit.
    mask_path : str or os.PathLike, optional
        A mask NIfTI on the DWI grid, when ``mask`` is not given. Without either, the brain
        mask is computed from the mean b=0 image (median filter, Otsu, largest component).
    params : DTIFitParams, optional
        Method, precision and b=0 threshold (s/mm²); the series' threshold by default.
    device : {"auto", "cpu", "gpu"}
        Where to fit.
    progress, cancelled : callable, optional
        ``progress(done, total)`` and a cancellation check, as :func:`tractlens.gpu.dti.fit_dti`.

    Returns
    -------
    DTIResult
        ``map(name)`` gives an (X, Y, Z) float32 map (``fa``, ``md``, ``ad``, ``rd``, ``mo``…,
        diffusivities in mm²/s); ``mask``, ``fit``, ``warnings`` and ``inputs`` as used.
        :func:`write_dti_outputs` writes it as FSL's ``dtifit`` names its files.

    Raises
    ------
    InputError
        A gradient table a tensor cannot be fitted to (no b=0, fewer than 6 directions).

    References
    ----------
    .. [1] Basser PJ, Mattiello J, LeBihan D. Biophys J 66:259-267 (1994).
    .. [2] Otsu N. A threshold selection method from gray-level histograms. IEEE Trans Syst Man
       Cybern 9:62-66 (1979): the brain mask computed when none is given.

    Examples
    --------
    >>> from tractlens.app.demo import demo_path
    >>> from tractlens.app.io import load_dwi, load_mask
    >>> from tractlens.app.pipelines.dti import fit_dti_pipeline
    >>> dwi = load_dwi(demo_path() / "dwi.nii.gz")
    >>> seed = load_mask(demo_path() / "roi_arc_seed.nii.gz")  # (X, Y, Z) bool, inside a bundle
    >>> result = fit_dti_pipeline(dwi, mask=seed, device="cpu")
    >>> fa = result.map("fa")
    >>> fa.shape, bool(fa[seed].mean() > 0.4), bool(fa[~seed].max() == 0)
    ((56, 56, 24), True, True)
    """
    params = params or DTIFitParams(b0_threshold=dwi.b0_threshold)
    require_weighted(dwi, params.b0_threshold, "the tensor fit")
    warnings = list(dwi.warnings)
    mask, mask_source = choose_mask(dwi, mask, mask_path, device, warnings)
    t0 = time.perf_counter()
    signal = masked_signal(dwi.data, mask)
    join_background_warmup()  # the device choice sees the start-up paid in the background
    choice = decide_device("fit-dti", signal.size, requested=device)
    device = choice.argument
    try:
        fit = run_with_cpu_fallback(
            lambda backend: fit_dti(
                signal, dwi.bvals, dwi.bvecs, params, device=backend, progress=progress, cancelled=cancelled
            ),
            device,
            warnings,
            "the tensor fit",
        )
    except ValueError as exc:  # the engine's word on an unusable gradient table
        raise InputError(
            str(exc),
            path=dwi.bvec_path or dwi.path,
            fix="A tensor fit needs a b=0 volume and at least 6 non-collinear directions; check the bval/bvec files",
        ) from exc
    fit.provenance["total_s"] = time.perf_counter() - t0
    fit.provenance["device_choice"] = choice.reason
    require_fitted(fit.flags, FLAG_NO_SIGNAL | FLAG_NONFINITE_SIGNAL | FLAG_FIT_FAILED, "fit-dti", dwi.path)
    no_signal = int(np.count_nonzero(fit.flags & FLAG_NO_SIGNAL))
    if no_signal:
        warnings.append(f"{no_signal} voxel(s) in the mask have no signal at b=0 and were not fitted")
    failed = {k: v for k, v in fit.flag_counts().items() if k != "no signal at b=0"}
    for name, count in failed.items():
        warnings.append(f"{count} voxel(s) flagged '{name}' (see {dti_file_name('flags')})")
    inputs = [str(p) for p in (dwi.path, dwi.bval_path, dwi.bvec_path, mask_path) if p]
    return DTIResult(dwi.affine, mask, fit, dwi.shape3, mask_source, warnings, inputs)


def _v1_fsl_frame(v1: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """V1 in FSL's bvec frame, in place and in float32 (the same values as
    :func:`~app.io.dwi.fsl_to_voxel_vectors`, without a float64 volume)."""
    if x_flip_needed(affine):
        np.negative(v1[..., 0], out=v1[..., 0])
    return v1


def _tensor_fsl_frame(tensor: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """The float32 tensor volume in FSL's order and frame, in place: the same bytes as
    :func:`~app.io.tensor.save_tensor` (``order="fsl"``) writes from it, without its three
    float64 copies of the whole grid. FSL's order is the internal one; the frame change
    negates xy and xz over the whole grid, as there (so zeros outside the mask become -0.0,
    as they do there), and negation commutes with the cast to float32."""
    if x_flip_needed(affine):
        for component in (sym3.XY, sym3.XZ):
            np.negative(tensor[..., component], out=tensor[..., component])
    return tensor


def write_dti_outputs(result: DTIResult, outdir: str | os.PathLike, prefix: str = DTI_PREFIX) -> dict[str, str]:
    """Write the maps of :data:`DTI_MAPS` into ``outdir`` as dtifit names them
    (``PREFIX_FA.nii.gz``, ...; atomic per file) and ``fit_dti.json`` beside them.

    Only the dtifit names are written (the names of earlier versions, ``FA.nii.gz``..., are
    still read, by :func:`~app.io.tensor.load_tensor`): both would double the folder's size."""
    prefix = check_prefix(prefix, outdir)
    out = check_output_folder(outdir)
    names = {dti_file_name(name, prefix) for name in DTI_MAPS}
    with output_set(out, "fit_dti.json", (*names, "fit_dti.json"), key=f"fit_dti-{prefix}") as stage:
        _write_dti_files(result, stage, prefix, outdir)
    return {name: str(out / dti_file_name(name, prefix)) for name in DTI_MAPS}


def _write_dti_files(result: DTIResult, out: Path, prefix: str, outdir) -> None:
    aff = result.affine
    # Each map is scattered from the masked voxels in the worker that writes it, so that only
    # the volumes being compressed are in memory at once, not all of them.
    jobs = [(lambda name=name: result.map(name.lower()), name, np.float32) for name in _SCALAR_MAPS]
    jobs += [(lambda name=name: _v1_fsl_frame(result.map(name.lower()), aff), name, np.float32) for name in _VECTORS]
    jobs += [
        (lambda: result.mask, "mask", np.uint8),
        (lambda: result.map("flags"), "flags", np.uint8),
        (lambda: _tensor_fsl_frame(result.map("tensor"), aff), "tensor", np.float32),
    ]

    def write(job) -> None:
        make, name, dtype = job
        save_volume(make(), aff, out / dti_file_name(name, prefix), dtype=dtype)

    # gzip compression dominates writing and zlib releases the GIL: compress files in parallel.
    with ThreadPoolExecutor(max_workers=min(8, host_threads())) as pool:
        for _ in pool.map(write, jobs):
            pass
    summary = {**result.summary(), "prefix": prefix}
    call = ("tractlens.write_dti_outputs", "<result>", outdir, {"prefix": prefix})
    write_json_summary(summary, out / "fit_dti.json", inputs=result.inputs, call=call)


_SCALAR_MAPS = ("FA", "MD", "MO", "AD", "RD", "RGB", "L1", "L2", "L3", "S0")
_VECTORS = ("V1", "V2", "V3")
