"""Streamline tractography on fibre orientation distributions (fODFs, from CSD).

Two trackers share one walk (the rules and the ragged output of :mod:`gpu.deterministic`):

* **deterministic** — MRtrix3's ``SD_STREAM`` (Tournier, Calamante & Connelly 2012): at every
  point the fODF is interpolated (trilinear in its coefficients) and the streamline follows
  the fODF peak nearest the incoming direction, found by Newton ascent on the sphere started
  from that direction;
* **probabilistic** — MRtrix3's ``iFOD1`` (Tournier et al. 2012) / DIPY's probabilistic
  direction getter: every step's direction is drawn in the cone of ``max_angle_deg`` about
  the incoming one with probability ∝ amplitude^``power``, by rejection sampling.

A streamline ends where the fODF amplitude falls below ``cutoff`` (``LOW_FA``: for these
trackers it reads "fODF below the cut-off"), where the next peak turns more than the max
angle (deterministic) or no draw in the cone was accepted within ``max_trials``
(probabilistic; both ``SHARP_ANGLE``), on leaving the volume or the mask, in a stop region,
or at the max length. Steps are Euler steps of ``step_mm`` (the voxel size scales each axis).

**Evaluating the fODF.** An even spherical-harmonic series of order ≤ 8 is, on the unit
sphere, a homogeneous polynomial of degree 8 in (x, y, z), which has 45 monomials — as many
as the series' 45 coefficients (lmax 8; lower orders are multiplied by x² + y² + z² = 1).
The field is converted once (:func:`sh_to_monomials`, exact to rounding) into monomial
coefficients in the voxel axes; then one step costs a trilinear fetch of 45 floats and a few
polynomial evaluations of ~100 multiply-adds, and the gradient comes free of angles and
poles. By Euler's theorem for homogeneous functions the amplitude is ``∇f·u / 8``.

**Peaks.** Each ascent iteration takes the tangential gradient at ``u``, measures the
curvature along its great circle by a secant (the directional derivative again 0.1 rad
further) and makes the Newton step along the circle (at most 0.3 rad; the full 0.3 rad
where the curvature is not negative). :data:`PEAK_ITERATIONS` iterations from the incoming
direction: steps are short, so the peak has moved little since the last point. This is
chosen over precomputed per-voxel peaks interpolated between voxels because those mix
neighbouring voxels' peaks (whose numbering and pairing between voxels is ambiguous in a
crossing) whereas the interpolated fODF's own peak is what SD_STREAM follows.

**Seeds.** The first direction is the largest peak: the amplitude on
:data:`SEED_DIRECTIONS` hemisphere directions, then the ascent from the best (deterministic);
the probabilistic tracker draws it on the whole sphere ∝ amplitude^power (falling back to
the largest peak). The second half starts the opposite way.

**Random numbers.** Philox4x32-10 (as :mod:`gpu.probabilistic`), one stream per streamline:
counter (step, trial | half << 16 | purpose << 24, streamline id low, high), the streamline id
being the seed's index in the whole run, so results do not depend on batching. The envelope
of the rejection sampler is ``ENVELOPE_MARGIN`` × the amplitude of the nearest peak.

Two engines: array operations over all live streamlines of a batch (NumPy in float64: the
reference; also runs on CuPy) and the CUDA kernel ``kernels/fod_tracking.cu`` (one thread
per streamline, float32). They follow the same steps; the kernel's float32 arithmetic makes
the deterministic streamlines agree to ~1e-3 voxel and the probabilistic ones statistically
(and exactly until a draw falls within rounding of its acceptance bound).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from . import cuda, tracking
from .backend import Backend, get_backend
from .engines import ARRAYS, KERNEL, choose_engine, engine_names
from .fod_params import FodDeterministicParams, FodProbabilisticParams
from .indices import flatnonzero
from .interpolate import trilinear
from .rng import philox4x32, seed_key
from .sh import fibonacci_hemisphere, lmax_of, n_coefficients, sh_basis
from .streamlines import LOW_FA, SHARP_ANGLE, StreamlineBatch, StreamlineScalars
from .tracking import drop

ENGINES = engine_names((KERNEL, ARRAYS))
DEGREE = 8
#: (a, b, c) of the 45 monomials x^a y^b z^c of degree 8, in the order the kernel reads them.
EXPONENTS = np.array([(a, b, DEGREE - a - b) for a in range(DEGREE + 1) for b in range(DEGREE + 1 - a)])
N_MONOMIALS = len(EXPONENTS)
#: Floats per voxel of the tracking field: 45 monomial coefficients padded to 12 float4 loads.
FIELD_STRIDE = 48
PEAK_ITERATIONS = 3
SECANT_RAD = 0.1
MAX_NEWTON_RAD = 0.3
ENVELOPE_MARGIN = 1.2
SEED_DIRECTIONS = fibonacci_hemisphere(64)
P_SEED, P_STEP = 1, 2  # random stream purposes
KERNEL_DEFINES = (
    *tracking.KERNEL_DEFINES,
    ("N_SEED_DIRECTIONS", len(SEED_DIRECTIONS)),
    ("PEAK_ITERATIONS", PEAK_ITERATIONS),
    ("P_SEED", P_SEED),
    ("P_STEP", P_STEP),
)

KERNEL_HEADERS = (*tracking.KERNEL_HEADERS, "philox.cuh")

FodParams = FodDeterministicParams | FodProbabilisticParams
DEFAULT_PARAMS = FodDeterministicParams()


def sh_to_monomials(lmax: int, rotation=None) -> np.ndarray:
    """(45, C) matrix taking MRtrix-basis coefficients (C of them, order ``lmax`` ≤ 8) to the
    coefficients of :data:`EXPONENTS`, the same function on the unit sphere.

    ``rotation`` (3, 3) maps the tracking frame's directions to the coefficients' frame (for a
    world-frame fODF tracked in voxel axes: the affine's orthogonal part), so that the
    polynomial at a voxel-axes direction ``u`` is the fODF at ``rotation @ u``."""
    if lmax > DEGREE:
        raise ValueError(f"fODF tracking handles lmax up to {DEGREE}, got {lmax}")
    samples = fibonacci_hemisphere(400)
    samples = np.concatenate([samples, -samples])
    frame = samples if rotation is None else samples @ np.asarray(rotation, np.float64).T
    basis = sh_basis(np, frame, lmax)  # the fODF at rotation @ u, for each sample u
    monomials = _monomials(np, samples)
    return np.linalg.lstsq(monomials, basis, rcond=None)[0]


def _monomials(xp, u):
    """(N, 45) values of the monomials at unit directions ``u`` (N, 3)."""
    powers = _powers(xp, u)
    return xp.stack([powers[0][a] * powers[1][b] * powers[2][c] for a, b, c in EXPONENTS], axis=-1)


def _powers(xp, u):
    """[x^0..x^8], [y^0..], [z^0..] of the rows of ``u``."""
    out = []
    for axis in range(3):
        column = u[:, axis]
        p = [xp.ones_like(column), column]
        for _ in range(2, DEGREE + 1):
            p.append(p[-1] * column)
        out.append(p)
    return out


def amplitude(xp, coefficients, u):
    """fODF amplitude (N,) of polynomial ``coefficients`` (N, ≥45) at unit directions ``u`` (N, 3)."""
    px, py, pz = _powers(xp, u)
    total = 0.0
    for k, (a, b, c) in enumerate(EXPONENTS):
        total = total + coefficients[:, k] * (px[a] * py[b] * pz[c])
    return total


def gradient(xp, coefficients, u):
    """Euclidean gradient (N, 3) of the degree-8 polynomial at ``u``; ``gradient · u / 8`` is the amplitude."""
    px, py, pz = _powers(xp, u)
    gx = gy = gz = 0.0
    for k, (a, b, c) in enumerate(EXPONENTS):
        w = coefficients[:, k]
        if a:
            gx = gx + w * (a * px[a - 1] * py[b] * pz[c])
        if b:
            gy = gy + w * (b * px[a] * py[b - 1] * pz[c])
        if c:
            gz = gz + w * (c * px[a] * py[b] * pz[c - 1])
    zero = xp.zeros(len(u), dtype=u.dtype)
    return xp.stack([gx + zero, gy + zero, gz + zero], axis=-1)


def _dot(xp, a, b):
    return xp.sum(a * b, axis=-1)


def nearest_peak(xp, coefficients, u, iterations: int = PEAK_ITERATIONS):
    """The fODF peak reached from unit directions ``u`` by Newton ascent along great circles:
    (directions (N, 3), amplitudes (N,))."""
    cs, sn = math.cos(SECANT_RAD), math.sin(SECANT_RAD)
    for _ in range(iterations):
        g = gradient(xp, coefficients, u)
        tangent = g - _dot(xp, g, u)[:, None] * u
        slope = xp.sqrt(_dot(xp, tangent, tangent))
        moving = slope > 1e-12
        t = tangent / xp.where(moving, slope, 1.0)[:, None]
        w = cs * u + sn * t
        slope_w = _dot(xp, gradient(xp, coefficients, w), cs * t - sn * u)
        curvature = (slope_w - slope) / SECANT_RAD
        step = xp.where(curvature < 0, -slope / xp.where(curvature < 0, curvature, -1.0), MAX_NEWTON_RAD)
        step = xp.where(moving, xp.clip(step, 0.0, MAX_NEWTON_RAD), 0.0)
        u = xp.cos(step)[:, None] * u + xp.sin(step)[:, None] * t
        u = u / xp.sqrt(_dot(xp, u, u))[:, None]
    return u, amplitude(xp, coefficients, u)


def largest_peak(xp, coefficients):
    """The largest fODF peak (directions (N, 3) on the upper hemisphere's side, amplitudes):
    the best of :data:`SEED_DIRECTIONS`, then the ascent."""
    dirs = xp.asarray(SEED_DIRECTIONS, dtype=coefficients.dtype)
    values = _monomials(xp, dirs) @ coefficients[:, :N_MONOMIALS].T  # (D, N)
    best = xp.argmax(values, axis=0)
    return nearest_peak(xp, coefficients, dirs[best], PEAK_ITERATIONS + 2)


# ----------------------------------------------------------------------------- the volume on a device
@dataclass
class FodSummary:
    """What a tracking run needs to know of an fODF volume before it tracks, computed where the
    volume goes to be tracked (:func:`summarise`): the voxels where it is defined (any coefficient
    non-zero), its generalized FA there (Tuch 2004), the voxels with NaN or infinite coefficients
    (emptied), and on a GPU the cleaned coefficients (X, Y, Z, C), kept there for the field."""

    mask: np.ndarray  # (X, Y, Z) bool, host
    gfa: np.ndarray  # (X, Y, Z) float32, host; 0 outside the mask
    nonfinite: int
    coefficients: object = None  # the device copy; None on the CPU


def summarise(sh, device: str | Backend = "cpu", chunk: int = 1 << 20) -> FodSummary:
    """:class:`FodSummary` of ``sh`` (X, Y, Z, C) float32 on ``device``, a chunk of voxels at a
    time: one upload serves the summary, the seed amplitudes (:func:`largest_amplitudes`) and the
    field (:func:`prepare_field` takes the device copy). Sums of squares in float64, as the host's
    ``einsum`` (the generalized FA may differ from it in the last float32 bit: another summation order)."""
    backend = get_backend(device)
    xp = backend.xp
    sh = np.asarray(sh)
    shape, c = sh.shape[:3], sh.shape[-1]
    flat = sh.reshape(-1, c)
    n = flat.shape[0]
    kept = xp.empty((n, c), np.float32) if backend.is_gpu else None
    mask = np.empty(n, bool)
    gfa = np.empty(n, np.float32)
    nonfinite = 0
    for a in range(0, n, chunk):
        part = xp.asarray(flat[a : a + chunk], dtype=np.float32)
        finite = xp.isfinite(part).all(axis=1)
        bad = int((~finite).sum())
        if bad:
            nonfinite += bad
            part = xp.where(finite[:, None], part, np.float32(0.0))
        wide = part.astype(np.float64)
        power = (wide * wide).sum(axis=1)
        inside = power > 0
        g = xp.sqrt(xp.clip(1.0 - wide[:, 0] ** 2 / xp.where(inside, power, 1.0), 0.0, 1.0))
        mask[a : a + chunk] = backend.to_host(inside)
        gfa[a : a + chunk] = backend.to_host((g * inside).astype(np.float32))
        if kept is not None:
            kept[a : a + chunk] = part
    coefficients = None if kept is None else kept.reshape(*shape, c)
    return FodSummary(mask.reshape(shape), gfa.reshape(shape), nonfinite, coefficients)


def largest_amplitudes(coefficients, voxels: np.ndarray, lmax: int, device: str | Backend = "cpu",
                       chunk: int = 1 << 18) -> np.ndarray:  # fmt: skip
    """The largest amplitude on :data:`SEED_DIRECTIONS` of the fODF (SH ``coefficients``
    (X, Y, Z, C), on the host or on ``device``) in the flat voxel indices ``voxels``: (V,) float32
    on the host, where whole-brain seeding compares it with the cut-off."""
    backend = get_backend(device)
    xp = backend.xp
    basis = xp.asarray(sh_basis(np, SEED_DIRECTIONS, lmax).astype(np.float32).T)  # (C, D)
    flat = coefficients.reshape(-1, coefficients.shape[-1])
    out = np.empty(len(voxels), np.float32)
    for a in range(0, len(voxels), chunk):
        at = voxels[a : a + chunk]
        rows = flat[xp.asarray(at)] if hasattr(flat, "__cuda_array_interface__") else flat[at]
        out[a : a + chunk] = backend.to_host((xp.asarray(rows, dtype=np.float32) @ basis).max(axis=1))
    return out


# ----------------------------------------------------------------------------- the field
@dataclass
class FodField:
    """What the fODF trackers read: monomial coefficients (:func:`sh_to_monomials`) in voxel
    axes padded to :data:`FIELD_STRIDE` floats per voxel, a region map (0 outside the mask, 1
    track, 2 stop) and the voxel size in millimetres."""

    poly: np.ndarray  # (X, Y, Z, 48) float32, on the host or the device
    region: np.ndarray  # (X, Y, Z) uint8
    voxel_size: np.ndarray
    notes: list

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(int(s) for s in self.region.shape)


def prepare_field(sh, voxel_size, *, rotation=None, mask=None, stop=None, device: str | Backend = "cpu") -> FodField:
    """Check and convert an fODF ``sh`` (X, Y, Z, C) in MRtrix's basis for tracking.

    ``rotation`` (3, 3): voxel axes → the coefficients' frame (:func:`app.io.fod.world_rotation`
    of the affine for a world-frame fODF; None when the coefficients are in voxel axes).
    Voxels with NaN or infinite coefficients are emptied (amplitude 0: tracking stops there).
    The conversion runs on ``device`` and the field stays there."""
    backend = get_backend(device)
    xp = backend.xp
    on_device = hasattr(sh, "__cuda_array_interface__")  # e.g. :func:`summarise`'s copy, converted where it is
    if on_device and not backend.is_gpu:
        sh, on_device = sh.get(), False
    sh = sh if on_device else np.asarray(sh)
    if sh.ndim != 4:
        raise ValueError(f"an fODF field must be (X, Y, Z, C), got shape {sh.shape}")
    lmax = lmax_of(int(sh.shape[-1]))
    shape = sh.shape[:3]
    voxel_size = tracking.checked_voxel_size(voxel_size)
    notes = []
    matrix = np.zeros((n_coefficients(lmax), FIELD_STRIDE), np.float32)
    matrix[:, :N_MONOMIALS] = sh_to_monomials(lmax, rotation).T
    flat = sh.reshape(-1, sh.shape[-1])
    poly = xp.empty((flat.shape[0], FIELD_STRIDE), np.float32)
    m = xp.asarray(matrix)
    chunk, nonfinite = 1 << 20, 0
    for a in range(0, flat.shape[0], chunk):  # checked and converted where the field will live
        part = xp.array(flat[a : a + chunk], dtype=np.float32)  # a copy: the caller's array stays
        bad = ~xp.isfinite(part).all(axis=1)
        part[bad] = 0.0
        nonfinite += int(bad.sum())
        poly[a : a + chunk] = part @ m
    if nonfinite:
        notes.append(f"{nonfinite} voxels with NaN or infinite fODF coefficients were treated as empty")
    region = tracking.region_map(shape, mask, stop, "fODF field")
    return FodField(poly.reshape(*shape, FIELD_STRIDE), region, voxel_size, notes)


# ----------------------------------------------------------------------------- random draws
def _uniforms(step, word1, sid, key, xp=np):
    """Three uniforms in (0, 1) per streamline from Philox (counter: ``step``, ``word1``, the
    streamline id ``sid``): 23-bit values, so float32 and float64 engines read the same numbers."""
    s = np.asarray(sid, dtype=np.uint64)
    counter = (np.asarray(step, np.uint64), np.asarray(word1, np.uint64), s & np.uint64(0xFFFFFFFF), s >> np.uint64(32))
    r = philox4x32(counter, key)
    return [xp.asarray(((x >> np.uint32(9)).astype(np.float64) + 0.5) * 2.0**-23) for x in r[:3]]


def _frame(xp, v):
    """Two unit vectors completing ``v`` (N, 3) to an orthonormal frame."""
    axis = xp.where((xp.abs(v[:, 0]) < 0.9)[:, None], xp.asarray([1.0, 0.0, 0.0]), xp.asarray([0.0, 1.0, 0.0]))
    t1 = axis - _dot(xp, axis, v)[:, None] * v
    t1 = t1 / xp.sqrt(_dot(xp, t1, t1))[:, None]
    return t1, xp.cross(v, t1)


def draw_in_cone(xp, coefficients, v, envelope, cos_max, params: FodProbabilisticParams, step, word1, sid, key):
    """Directions drawn in the cone of ``cos_max`` about ``v`` with probability ∝ amplitude^power
    (rejection under ``envelope``), at most ``params.max_trials`` draws: (directions, accepted).
    ``step``/``word1``/``sid`` (host arrays) number each streamline's random stream."""
    n = len(v)
    chosen = v.copy()
    accepted = xp.zeros(n, bool)
    t1, t2 = _frame(xp, v)
    bound = xp.maximum(envelope, 0.0) ** params.power
    pending = np.arange(n)
    for trial in range(params.max_trials):
        if not len(pending):
            break
        at = xp.asarray(pending)
        u1, u2, u3 = _uniforms(step[pending], word1 + trial, sid[pending], key, xp)
        cos_t = 1.0 - u1 * (1.0 - cos_max)
        sin_t = xp.sqrt(xp.maximum(1.0 - cos_t * cos_t, 0.0))
        phi = 2.0 * math.pi * u2
        cand = cos_t[:, None] * v[at] + sin_t[:, None] * (xp.cos(phi)[:, None] * t1[at] + xp.sin(phi)[:, None] * t2[at])
        a = amplitude(xp, coefficients[at], cand)
        ok = (a >= params.cutoff) & (u3 * bound[at] < xp.maximum(a, 0.0) ** params.power)
        chosen[at[ok]] = cand[ok]
        accepted[at[ok]] = True
        pending = pending[~_host(ok)]
    return chosen, accepted


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


# ----------------------------------------------------------------------------- arrays engine
def _track_arrays(xp, field, region, scale, seeds, sids, params: FodParams, key):
    """Both halves of every seed's streamline (:func:`gpu.tracking.walk`'s buffers)."""
    probabilistic = isinstance(params, FodProbabilisticParams)
    cos_max = math.cos(math.radians(params.max_angle_deg))

    def start(p0, valid, stop):
        coef0 = trilinear(xp, field, p0)
        d0, a0 = largest_peak(xp, coef0)
        low = valid & (a0 < params.cutoff)
        stop[low] = LOW_FA
        begin = flatnonzero(xp, valid & ~low)
        if probabilistic and len(begin):
            host = _host(begin)
            drawn, ok = draw_in_cone(xp, coef0[begin], d0[begin], ENVELOPE_MARGIN * a0[begin], -1.0, params,
                                     np.zeros(len(host), np.uint64), P_SEED << 24, sids[host], key)  # fmt: skip
            d0[begin] = xp.where(ok[:, None], drawn, d0[begin])
        return d0, begin

    def turn(stop, idx, q, d, steps, end):
        coef = trilinear(xp, field, q)
        peak, a = nearest_peak(xp, coef, d)
        live = drop(stop, idx, end, a < params.cutoff, LOW_FA)
        idx, q, d, steps, coef, peak, a = (x[live] for x in (idx, q, d, steps, coef, peak, a))
        if probabilistic:
            e, ok = draw_in_cone(xp, coef, d, ENVELOPE_MARGIN * a, cos_max, params, _host(steps).astype(np.uint64),
                                 (P_STEP << 24) | (end << 16), sids[_host(idx)], key)  # fmt: skip
            live = drop(stop, idx, end, ~ok, SHARP_ANGLE)
        else:
            e = peak
            live = drop(stop, idx, end, _dot(xp, e, d) < cos_max, SHARP_ANGLE)
        return idx[live], q[live], e[live], steps[live]

    h = xp.asarray(scale * params.step_mm, dtype=np.float64)
    return tracking.walk(xp, region, seeds, params.max_steps, h, start=start, turn=turn)


# ----------------------------------------------------------------------------- CUDA kernel
def _kernel():
    return cuda.function("fod_tracking.cu", "track_fod", KERNEL_HEADERS, KERNEL_DEFINES)


def _track_kernel(backend: Backend, field, region, scale, seeds, first_id: int, params: FodParams, key):
    h = scale * params.step_mm
    arguments = (
        np.uint64(first_id),
        *(np.float32(x) for x in h),
        np.float32(params.cutoff),
        np.float32(math.cos(math.radians(params.max_angle_deg))),
        np.int32(params.max_steps),
        np.int32(isinstance(params, FodProbabilisticParams)),
        np.float32(getattr(params, "power", 1.0)),
        np.int32(getattr(params, "max_trials", 0)),
        np.uint32(key[0]),
        np.uint32(key[1]),
        np.float32(SECANT_RAD),
        np.float32(MAX_NEWTON_RAD),
        np.float32(ENVELOPE_MARGIN),
        backend.xp.asarray(SEED_DIRECTIONS, dtype=np.float32),
    )
    return tracking.launch(_kernel(), backend, field, region, seeds, params.max_steps, arguments)


# ----------------------------------------------------------------------------- driver
def track(
    field: FodField,
    seeds,
    params: FodParams = DEFAULT_PARAMS,
    *,
    rng_seed: int = 0,
    first_id: int = 0,
    device: str | Backend = "auto",
    engine: str = "auto",
    max_batch: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancelled: Callable[[], bool] | None = None,
    scalars: StreamlineScalars | None = None,
) -> Iterator[StreamlineBatch]:
    """Track on ``field`` (:func:`prepare_field`) from ``seeds`` ((N, 3) voxel coordinates),
    yielding batches of streamlines as :func:`gpu.deterministic.track` does (same stop codes,
    provenance, ``scalars``). ``params`` chooses the tracker: :class:`FodDeterministicParams`
    (SD_STREAM) or :class:`FodProbabilisticParams` (iFOD1, random streams from ``rng_seed``;
    streamline ids start at ``first_id``). Cancelling between batches raises
    :class:`gpu.backend.Cancelled`."""
    backend = get_backend(device)
    xp = backend.xp
    engine = choose_engine(engine, backend, available=(KERNEL, ARRAYS), method="fODF tracking")
    if not 0 <= rng_seed < 2**63:
        raise ValueError("the random seed must be a non-negative 63-bit integer")
    key = seed_key(int(rng_seed))
    seeds = np.asarray(seeds, dtype=np.float64).reshape(-1, 3)
    poly = backend.asarray(field.poly.get() if hasattr(field.poly, "get") and not backend.is_gpu else field.poly)
    region = backend.asarray(field.region)
    scale = 1.0 / field.voxel_size

    def track_chunk(a: int, b: int, chunk):
        if engine == KERNEL:
            return _track_kernel(backend, poly, region, scale, chunk, first_id + a, params, key)
        sids = np.arange(first_id + a, first_id + b, dtype=np.uint64)
        return _track_arrays(xp, poly, region, xp.asarray(scale), chunk, sids, params, key)

    yield from tracking.track_batches(
        backend, seeds, params, track_chunk, max_batch=max_batch, progress=progress, cancelled=cancelled,
        scalars=scalars,
    )  # fmt: skip


def track_all(field: FodField, seeds, params: FodParams = DEFAULT_PARAMS, **kwargs) -> StreamlineBatch:
    """All batches of :func:`track` joined, with provenance (parameters, backend, timing)."""
    backend = get_backend(kwargs.pop("device", "auto"))
    t0 = time.perf_counter()
    batches = list(track(field, seeds, params, device=backend, **kwargs))
    method = "fod-probabilistic" if isinstance(params, FodProbabilisticParams) else "fod-deterministic"
    return tracking.joined(batches, method, params, backend, seeds, t0)
