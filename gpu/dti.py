"""Diffusion tensor fitting: OLS and WLS, eigen-decomposition and scalar maps.

Signal model (Basser et al. 1994): S_k = S0 · exp(-b_k g_kᵀ D g_k). We fit
ln S with the 7-column design matrix [1, -b gx², -2b gx gy, -2b gx gz, -b gy²,
-2b gy gz, -b gz²] (parameters ln S0, Dxx, Dxy, Dxz, Dyy, Dyz, Dzz):

* OLS: β = X⁺ ln S with the pseudo-inverse X⁺ computed once in float64.
* WLS: β = (Xᵀ W X)⁻¹ Xᵀ W ln S with W = diag(Ŝ²), Ŝ the OLS prediction
  (Chung et al. 2006; DIPY's default ``wls``).

Two engines compute exactly this. The array engine (NumPy reference, CuPy
fallback) forms the per-voxel normal equations with two matrix products over all
voxels of a batch (weights × the 28 unique column products, weighted log-signal
× X), so the heavy part is BLAS/cuBLAS on either backend; the 7x7 systems are
then solved by a batched Cholesky factorisation and the tensors decomposed by
:mod:`gpu.sym3`, both in float64 (they are O(voxels), cheap next to the
O(voxels × volumes) products). The kernel engine (the GPU default) fuses the
same steps into one CUDA kernel, ``kernels/dti_fit.cu``, one warp per voxel,
reading the signal once instead of making ~10 passes and ~500 launches.
b-values are divided by their maximum before the fit so the columns are O(1)
in float32, and the result is scaled back: the tensor comes out in the inverse
units of the b-values (mm²/s for s/mm²).

Matches DIPY's ``TensorModel`` (``fit_method="WLS"`` / ``"OLS"``): signals are
clamped to ``min_signal`` before the log; eigenvalues are clipped from below at
``1e-6 / -min(X)`` before FA, MD, AD and RD, as DIPY does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import cuda, sym3
from .backend import Backend, flag_counts, get_backend, run_batched
from .engines import ARRAYS, KERNEL, choose_engine
from .params import meta

# Per-voxel flags (bit field) in DTIFit.flags; 0 means a clean fit.
FLAG_NONFINITE_SIGNAL = 1  #: NaN or Inf among the voxel's signals; not fitted.
FLAG_NO_SIGNAL = 2  #: every b=0 signal is zero or negative; not fitted.
FLAG_FIT_FAILED = 4  #: singular normal equations or non-finite result.
FLAG_NOT_POSITIVE_DEFINITE = 8  #: an eigenvalue ≤ 0 before clipping.

FLAG_NAMES = {
    FLAG_NONFINITE_SIGNAL: "non-finite signal",
    FLAG_NO_SIGNAL: "no signal at b=0",
    FLAG_FIT_FAILED: "fit failed",
    FLAG_NOT_POSITIVE_DEFINITE: "not positive definite",
}
#: What kernels/dti_fit.cu receives at compile time: the flag bits.
KERNEL_DEFINES = (
    ("FLAG_NONFINITE_SIGNAL", FLAG_NONFINITE_SIGNAL),
    ("FLAG_NO_SIGNAL", FLAG_NO_SIGNAL),
    ("FLAG_FIT_FAILED", FLAG_FIT_FAILED),
    ("FLAG_NOT_POSITIVE_DEFINITE", FLAG_NOT_POSITIVE_DEFINITE),
)

#: DIPY's default floor on the signal before the logarithm.
MIN_SIGNAL = 1e-4


@dataclass(frozen=True)
class DTIFitParams:
    """Parameters of the tensor fit.

    method : ``"wls"`` (weighted, default, recommended) or ``"ols"``.
    min_signal : signals below this are raised to it before the log (signal units).
    precision : ``"float32"``, ``"float64"`` or ``"auto"`` (float32 on the GPU,
        float64 on the CPU) for the products over all measurements. The 7x7
        solves and eigen-decompositions are always float64.
    b0_threshold : b-values at or below this count as b=0 (s/mm²).
    engine : ``"auto"`` (the fused CUDA kernel on the GPU, array operations on
        the CPU), ``"kernel"`` (GPU only) or ``"arrays"`` (either backend; the
        NumPy run of it is the reference the kernel is tested against).
    """

    method: str = field(
        default="wls",
        metadata=meta("Method", "least-squares fit: weighted (recommended) or ordinary", choices=("wls", "ols")),
    )
    min_signal: float = field(
        default=MIN_SIGNAL, metadata=meta("Minimum signal", "signals below this are raised to it")
    )
    precision: str = field(
        default="auto",
        metadata=meta(
            "Precision",
            "precision of the products over all volumes",
            choices=("auto", "float32", "float64"),
        ),
    )
    b0_threshold: float = field(
        default=50.0, metadata=meta("b=0 threshold", "b-values up to this count as b=0", "s/mm²", (0.0, 500.0))
    )
    engine: str = field(
        default="auto",
        metadata=meta("Engine", "the fused CUDA kernel or array operations", choices=("auto", "kernel", "arrays")),
    )

    def __post_init__(self):
        if self.method not in ("wls", "ols"):
            raise ValueError(f"unknown tensor fit method {self.method!r}: use 'wls' or 'ols'")
        if self.precision not in ("auto", "float32", "float64"):
            raise ValueError(f"unknown precision {self.precision!r}")
        if not self.min_signal > 0:
            raise ValueError("min_signal must be strictly positive")
        if self.engine not in ("auto", "kernel", "arrays"):
            raise ValueError(f"unknown engine {self.engine!r}: use 'auto', 'kernel' or 'arrays'")


@dataclass
class DTIFit:
    """Result of a tensor fit over N voxels; host NumPy arrays.

    tensor : (N, 6) float64, order xx, xy, xz, yy, yz, zz, units of 1/b.
    s0 : (N,) fitted non-diffusion-weighted signal.
    evals : (N, 3) λ1 ≥ λ2 ≥ λ3 after clipping.
    evecs : (N, 3, 3); ``evecs[:, :, 0]`` is the main direction e1.
    fa, md, ad, rd : (N,) scalar maps.
    rgb : (N, 3) directionally encoded colour |e1|·FA in [0, 1].
    flags : (N,) uint8 bit field (FLAG_*).
    provenance : parameters, backend, device and timings.
    """

    tensor: np.ndarray
    s0: np.ndarray
    evals: np.ndarray
    evecs: np.ndarray
    fa: np.ndarray
    md: np.ndarray
    ad: np.ndarray
    rd: np.ndarray
    rgb: np.ndarray
    flags: np.ndarray
    provenance: dict = field(default_factory=dict)

    def flag_counts(self) -> dict[str, int]:
        """How many voxels carry each flag, by name (only flags that occur)."""
        return flag_counts(self.flags, FLAG_NAMES)


def design_matrix(bvals: np.ndarray, bvecs: np.ndarray) -> np.ndarray:
    """The (K, 7) log-linear design matrix in the module's parameter order."""
    b = np.asarray(bvals, dtype=np.float64)
    g = np.asarray(bvecs, dtype=np.float64)
    gx, gy, gz = g[:, 0], g[:, 1], g[:, 2]
    return np.stack(
        [
            np.ones_like(b),
            -b * gx * gx,
            -2 * b * gx * gy,
            -2 * b * gx * gz,
            -b * gy * gy,
            -2 * b * gy * gz,
            -b * gz * gz,
        ],
        axis=1,
    )


@dataclass(frozen=True)
class _Design:
    """Host-side constants of one acquisition, computed once per fit."""

    X: np.ndarray  # (K, 7) scaled design matrix
    pinv: np.ndarray  # (7, K)
    pairs: np.ndarray  # (K, 28) products X_ki X_kj, i <= j
    pair_index: tuple  # (i, j) of each of the 28 columns
    b_scale: float
    min_diffusivity: float
    b0: np.ndarray  # bool (K,)

    @classmethod
    def build(cls, bvals, bvecs, b0_threshold: float) -> _Design:
        bvals = np.asarray(bvals, dtype=np.float64)
        bvecs = np.array(bvecs, dtype=np.float64)
        # A b=0 row's direction is irrelevant; files often store NaN or 0 there.
        bvecs[(bvals <= b0_threshold) & ~np.isfinite(bvecs).all(axis=1)] = 0.0
        if not (np.isfinite(bvals).all() and np.isfinite(bvecs).all()):
            raise ValueError("b-values and diffusion-weighted b-vectors must be finite")
        raw = design_matrix(bvals, bvecs)
        b_scale = float(bvals.max()) if bvals.max() > 0 else 1.0
        X = raw.copy()
        X[:, 1:] /= b_scale
        pair_index = tuple((i, j) for i in range(7) for j in range(i, 7))
        pairs = np.stack([X[:, i] * X[:, j] for i, j in pair_index], axis=1)
        rank = np.linalg.matrix_rank(X)
        if rank < 7:
            raise ValueError(
                f"the gradient table does not determine a tensor (design matrix rank {rank} < 7): "
                "at least six non-collinear directions with b > 0 and one b=0 are needed"
            )
        min_diffusivity = 1e-6 / max(-raw.min(), 1e-12)
        return cls(X, np.linalg.pinv(X), pairs, pair_index, b_scale, min_diffusivity, bvals <= b0_threshold)


def _cholesky_solve(xp, normal, rhs):
    """Solve N symmetric positive-definite 7x7 systems by Cholesky, vectorised over N.

    ``normal`` is a dict {(i, j): (N,) array} for i <= j, ``rhs`` a list of 7 (N,)
    arrays. Returns the solution (list of 7 arrays) and a bool (N,) array that is
    true where a pivot was not positive (the system is singular or indefinite).
    """
    n = len(rhs)
    L = {}
    failed = xp.zeros(rhs[0].shape, dtype=bool)
    for j in range(n):
        s = normal[(j, j)]
        for k in range(j):
            s = s - L[(j, k)] * L[(j, k)]
        bad = ~(s > 1e-300)
        failed |= bad
        diag = xp.sqrt(xp.where(bad, 1.0, s))
        L[(j, j)] = diag
        for i in range(j + 1, n):
            t = normal[(j, i)]
            for k in range(j):
                t = t - L[(i, k)] * L[(j, k)]
            L[(i, j)] = t / diag
    y = []
    for i in range(n):
        t = rhs[i]
        for k in range(i):
            t = t - L[(i, k)] * y[k]
        y.append(t / L[(i, i)])
    x = [None] * n
    for i in reversed(range(n)):
        t = y[i]
        for k in range(i + 1, n):
            t = t - L[(k, i)] * x[k]
        x[i] = t / L[(i, i)]
    return x, failed


def _engine(params: DTIFitParams, backend: Backend) -> str:
    return choose_engine(params.engine, backend, available=(KERNEL, ARRAYS), method="the tensor fit")


def fit_batch(backend: Backend, signal, design: _Design, params: DTIFitParams, dtype) -> dict:
    """Fit one batch already on ``backend``'s device: ``signal`` is (N, K).

    Returns a dict of device arrays (see :class:`DTIFit` for the fields).
    """
    if _engine(params, backend) == KERNEL:
        return _fit_batch_kernel(backend, signal, design, params, dtype)
    return _fit_batch_arrays(backend, signal, design, params, dtype)


def _cuda_function(name: str):
    return cuda.function("dti_fit.cu", name, ("sym3.cuh",), KERNEL_DEFINES)


def _fit_batch_kernel(backend: Backend, signal, design: _Design, params: DTIFitParams, dtype) -> dict:
    """The same fit as :func:`_fit_batch_arrays`, fused into one CUDA kernel (gpu/kernels/dti_fit.cu)."""
    cp = backend.xp
    n, k = signal.shape
    data = cp.ascontiguousarray(signal, dtype=dtype)  # a column-major block is transposed here
    X = cp.asarray(np.ascontiguousarray(design.X), dtype=cp.float64)
    pinv = cp.asarray(np.ascontiguousarray(design.pinv), dtype=cp.float64)
    is_b0 = cp.asarray(design.b0 if design.b0.any() else np.ones(k, dtype=bool), dtype=cp.uint8)
    out = {
        "tensor": cp.empty((n, 6)),
        "s0": cp.empty(n),
        "evals": cp.empty((n, 3)),
        "evecs": cp.empty((n, 3, 3)),
        "fa": cp.empty(n),
        "md": cp.empty(n),
        "ad": cp.empty(n),
        "rd": cp.empty(n),
        "rgb": cp.empty((n, 3)),
        "flags": cp.empty(n, dtype=cp.uint8),
    }
    if n == 0:
        return out
    threads = 256  # 8 warps: one voxel per warp
    blocks = (n + threads // 32 - 1) // (threads // 32)
    kernel = _cuda_function("dti_fit_float32" if np.dtype(dtype) == np.float32 else "dti_fit_float64")
    args = (
        data,
        np.int64(n),
        np.int32(k),
        X,
        pinv,
        is_b0,
        np.int32(params.method == "wls"),
        np.dtype(dtype).type(params.min_signal),
        np.float64(design.b_scale),
        np.float64(design.min_diffusivity),
        *(out[key] for key in ("tensor", "s0", "evals", "evecs", "fa", "md", "ad", "rd", "rgb", "flags")),
    )
    kernel((blocks,), (threads,), args)
    return out


def _fit_batch_arrays(backend: Backend, signal, design: _Design, params: DTIFitParams, dtype) -> dict:
    """The fit written with array operations: NumPy reference and CuPy fallback."""
    xp = backend.xp
    # Few full passes over the (N, K) data and at most two (N, K) work arrays:
    # the kernels are memory-bound, so passes and allocations are the cost.
    nonfinite = ~xp.isfinite(signal).all(axis=1)
    # order="C": a column-major input (volume-major NIfTI gathers) is transposed here, on the device.
    log_s = xp.nan_to_num(signal.astype(dtype, order="C", copy=True), copy=False, nan=1.0, posinf=1.0, neginf=1.0)
    b0_index = np.flatnonzero(design.b0) if design.b0.any() else np.arange(log_s.shape[1])
    no_signal = ~(log_s[:, xp.asarray(b0_index)].max(axis=1) > 0)
    xp.maximum(log_s, dtype(params.min_signal), out=log_s)
    xp.log(log_s, out=log_s)

    X = xp.asarray(design.X, dtype=dtype)
    beta = log_s @ xp.asarray(design.pinv.T, dtype=dtype)  # OLS, (N, 7)
    if params.method == "wls":
        # W = Ŝ²; dividing by Ŝ0² (dropping column 0) changes no solution and
        # keeps the weights ≤ ~1 so float32 products cannot overflow.
        weights = beta[:, 1:] @ xp.asarray(X[:, 1:].T, order="C")
        weights *= 2.0
        xp.minimum(weights, dtype(60.0), out=weights)
        xp.exp(weights, out=weights)
        normal_flat = (weights @ xp.asarray(design.pairs, dtype=dtype)).astype(xp.float64)
        weights *= log_s
        rhs_flat = (weights @ X).astype(xp.float64)
        del weights
        normal = {pair: normal_flat[:, c] for c, pair in enumerate(design.pair_index)}
        solution, singular = _cholesky_solve(xp, normal, [rhs_flat[:, i] for i in range(7)])
        beta = xp.stack(solution, axis=1)
    else:
        beta = beta.astype(xp.float64)
        singular = xp.zeros(beta.shape[0], dtype=bool)
    del log_s

    tensor = beta[:, 1:] / design.b_scale
    s0 = xp.exp(beta[:, 0])
    failed = singular | ~xp.isfinite(beta).all(axis=1) | ~xp.isfinite(s0)
    skip = nonfinite | no_signal | failed
    tensor = xp.where(skip[:, None], 0.0, tensor)
    s0 = xp.where(skip, 0.0, s0)

    evals, evecs = sym3.eigh(xp, tensor)
    not_pd = (evals[:, 2] <= 0) & ~skip
    evals = xp.maximum(evals, design.min_diffusivity)
    evals = xp.where(skip[:, None], 0.0, evals)
    maps = scalar_maps(xp, evals, evecs)

    flags = (
        nonfinite.astype(xp.uint8) * FLAG_NONFINITE_SIGNAL
        + (no_signal & ~nonfinite).astype(xp.uint8) * FLAG_NO_SIGNAL
        + (failed & ~nonfinite & ~no_signal).astype(xp.uint8) * FLAG_FIT_FAILED
        + not_pd.astype(xp.uint8) * FLAG_NOT_POSITIVE_DEFINITE
    )
    return dict(tensor=tensor, s0=s0, evals=evals, evecs=evecs, flags=flags, **maps)


def scalar_maps(xp, evals, evecs) -> dict:
    """FA, MD, AD, RD and colour-FA from eigenvalues (N, 3) and eigenvectors (N, 3, 3)."""
    l1, l2, l3 = evals[:, 0], evals[:, 1], evals[:, 2]
    md = (l1 + l2 + l3) / 3.0
    norm2 = l1 * l1 + l2 * l2 + l3 * l3
    spread = (l1 - l2) ** 2 + (l1 - l3) ** 2 + (l2 - l3) ** 2
    fa = xp.where(norm2 > 0, xp.sqrt(0.5 * spread / xp.where(norm2 > 0, norm2, 1.0)), 0.0)
    rgb = xp.clip(xp.abs(evecs[:, :, 0]) * fa[:, None], 0.0, 1.0)
    return dict(fa=fa, md=md, ad=l1, rd=0.5 * (l2 + l3), rgb=rgb)


def fit_dti(
    signal: np.ndarray,
    bvals: np.ndarray,
    bvecs: np.ndarray,
    params: DTIFitParams | None = None,
    *,
    device: str | Backend = "auto",
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    batch_voxels: int | None = None,
) -> DTIFit:
    """Fit tensors to the (N, K) signals of N voxels; host arrays in, host arrays out.

    Weighted (or ordinary) least squares on the log signal, as DIPY's ``TensorModel``, then a
    closed-form eigen-decomposition and the scalar maps. Work is batched to fit the device's
    free memory, halved and retried on out-of-memory.

    Parameters
    ----------
    signal : numpy.ndarray
        (N, K) diffusion signal of N voxels, any positive scale.
    bvals : numpy.ndarray
        (K,) b-values in s/mm².
    bvecs : numpy.ndarray
        (K, 3) unit gradient directions in the frame the tensor is expressed in (voxel axes
        for the rest of TractLens); zero rows for b=0.
    params : DTIFitParams, optional
        Method (``wls``/``ols``), precision and b=0 threshold (s/mm²).
    device : {"auto", "cpu", "gpu"} or Backend
        Where to fit; ``auto`` takes the GPU when CuPy finds one.
    progress : callable, optional
        ``progress(voxels_done, total)`` after each batch.
    cancelled : callable, optional
        Polled between batches; when it returns True, :class:`gpu.backend.Cancelled` is raised.
    batch_voxels : int, optional
        Caps the batch size (finer progress and cancellation); memory-sized by default.

    Returns
    -------
    DTIFit
        Per voxel: ``tensor`` (N, 6) in mm²/s, ``evals`` (N, 3) λ1 ≥ λ2 ≥ λ3 in mm²/s,
        ``evecs`` (N, 3, 3) with the eigenvectors as columns, ``fa``, ``md``, ``ad``, ``rd``
        (mm²/s), ``rgb``, ``s0``, ``flags`` and the ``provenance`` (backend, device, timings).

    References
    ----------
    .. [1] Basser PJ, Mattiello J, LeBihan D. MR diffusion tensor spectroscopy and imaging.
       Biophys J 66:259-267 (1994).
    .. [2] Garyfallidis E et al. DIPY, a library for the analysis of diffusion MRI data.
       Front Neuroinform 8:8 (2014).

    Examples
    --------
    A voxel of a fibre along x (λ = 1.7, 0.3, 0.3 × 10⁻³ mm²/s), six directions at b = 1000:

    >>> import numpy as np
    >>> from tractlens.gpu.dti import fit_dti
    >>> s = 0.5 ** 0.5
    >>> bvecs = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [s, s, 0], [s, 0, s], [0, s, s]])
    >>> bvals = np.array([0.0, 1000, 1000, 1000, 1000, 1000, 1000])
    >>> D = np.diag([1.7e-3, 0.3e-3, 0.3e-3])
    >>> signal = 100 * np.exp(-bvals * np.einsum("ki,ij,kj->k", bvecs, D, bvecs))
    >>> fit = fit_dti(signal[None, :], bvals, bvecs, device="cpu")
    >>> round(float(fit.fa[0]), 2), round(float(fit.md[0]) * 1e3, 3)  # FA 0.799, MD 0.767e-3 mm²/s
    (0.8, 0.767)
    >>> np.abs(fit.evecs[0][:, 0]).round(3).tolist()  # the main direction: x
    [1.0, 0.0, 0.0]
    """
    params = params or DTIFitParams()
    backend = get_backend(device)
    signal = np.asarray(signal)
    if signal.ndim != 2 or signal.shape[1] != len(bvals):
        raise ValueError(f"signal must be (voxels, {len(bvals)}), got {signal.shape}")
    design = _Design.build(bvals, bvecs, params.b0_threshold)
    dtype = _resolve_dtype(backend, params.precision)
    n, k = signal.shape
    out = _allocate(n)
    item = np.dtype(dtype).itemsize
    # Peak: the input batch, log S and weights (N x K each), a boolean mask, small rest.
    bytes_per_voxel = k * (signal.dtype.itemsize + 2 * item + 1) + 1600
    timings = {"transfer_s": 0.0, "compute_s": 0.0, "batches": 0}

    def process(start: int, stop: int) -> None:
        t0 = time.perf_counter()
        batch = _to_device(backend, signal[start:stop])
        backend.synchronize()
        t1 = time.perf_counter()
        result = fit_batch(backend, batch, design, params, dtype)
        backend.synchronize()
        t2 = time.perf_counter()
        for key, value in result.items():
            out[key][start:stop] = backend.to_host(value)
        timings["transfer_s"] += (t1 - t0) + (time.perf_counter() - t2)
        timings["compute_s"] += t2 - t1
        timings["batches"] += 1  # batches that fitted (one that ran out of memory is halved and retried)

    run_batched(backend, n, bytes_per_voxel, process, progress=progress, cancelled=cancelled, maximum=batch_voxels)
    fit = DTIFit(**out)
    fit.provenance = {
        "method": params.method,
        "engine": _engine(params, backend),
        "precision": np.dtype(dtype).name,
        "min_signal": params.min_signal,
        "backend": backend.name,
        "device": backend.device_name,
        "voxels": n,
        "volumes": k,
        **timings,
    }
    return fit


def _to_device(backend: Backend, host: np.ndarray):
    """Copy an (n, K) block to the device without a host-side transpose.

    A column-major block (as gathered volume by volume from a NIfTI file) is
    sent as its (K, n) transpose, whose rows are contiguous, and viewed back.
    """
    if host.ndim == 2 and host.strides[0] < host.strides[1]:
        return backend.asarray(np.ascontiguousarray(host.T)).T
    return backend.asarray(host)


def _resolve_dtype(backend: Backend, precision: str):
    if precision == "auto":
        return np.float32 if backend.is_gpu else np.float64
    return np.dtype(precision).type


def _allocate(n: int) -> dict:
    return dict(
        tensor=np.zeros((n, 6)),
        s0=np.zeros(n),
        evals=np.zeros((n, 3)),
        evecs=np.zeros((n, 3, 3)),
        fa=np.zeros(n),
        md=np.zeros(n),
        ad=np.zeros(n),
        rd=np.zeros(n),
        rgb=np.zeros((n, 3)),
        flags=np.zeros(n, dtype=np.uint8),
    )
