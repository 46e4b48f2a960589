"""Measures along streamlines: along-tract profiles and distance to a region (e.g. a lesion).

Profiles: every streamline is resampled to K points equally spaced along its arc length
(in mm), streamlines are flipped so that all run the same way (each is compared with the
bundle's mean course, itself refined twice), a scalar map is sampled trilinearly at the
K points, and the profile is the weighted mean ± sd across streamlines at each point: the
tractometry of AFQ (Yeatman et al. 2012, "Tract profiles of white matter properties:
automating fiber-tract quantification", PLoS ONE 7(11): e49790) as pyAFQ computes it. With
``weighting="gaussian"`` (pyAFQ's ``profile_weights="gauss"``, DIPY's ``gaussian_weights``) the
spread of the K-th points of all streamlines is modelled as a 3-D Gaussian around the bundle's
core (their mean); a streamline's weight at that point is the inverse of its Mahalanobis distance
to the core, normalised to sum to 1, so streamlines far from the core count less.
``weighting="none"`` is the plain mean.

Distance to a region: each region voxel is taken as the ellipsoid inscribed in it (for
isotropic voxels a ball one voxel across), so the distance from a point to a region voxel
is the distance to its centre less half a voxel in that direction, and 0 inside a region
voxel. Which region voxel is nearest comes from the exact Euclidean distance transform of
the region (on its grid, in mm): the point takes the nearest of the region voxels nearest
to the eight voxels around it, each distance computed exactly from the point (no
interpolation). For a voxelised sphere this is the analytic distance to the sphere within
half a voxel. Each segment is sampled at most ``step_mm`` apart, so a streamline passing
close to the region between two of its points is not missed: the distance is 1-Lipschitz,
so the minimum found is at most ``step_mm / 2`` above the minimum over the polyline.
Array operations on ``xp``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backend import Backend, get_backend, iter_batched
from .interpolate import trilinear
from .params import meta

#: How streamlines are averaged at a node (:class:`ProfileParams` ``weighting``).
WEIGHTINGS = ("gaussian", "none")


@dataclass(frozen=True)
class ProfileParams:
    """How an along-tract profile samples its bundle.

    n_points: nodes along the bundle (pyAFQ's 100). weighting: how streamlines are averaged at a
    node: ``gaussian`` (pyAFQ's default, Yeatman et al. 2012: the inverse Mahalanobis distance of
    the streamline's node to the bundle's core at that node) or ``none`` (the plain mean)."""

    n_points: int = field(
        default=100,
        metadata=meta("Points", "points along the bundle", "", (2, 1000)),
    )
    weighting: str = field(
        default="gaussian",
        metadata=meta(
            "Weighting",
            "how streamlines are averaged at each point: gaussian (pyAFQ: by the inverse Mahalanobis "
            "distance to the bundle's core) or none (plain mean)",
            choices=WEIGHTINGS,
        ),
    )


# ---------------------------------------------------------------- resampling and orientation


def resample(points: np.ndarray, offsets: np.ndarray, n_points: int, linear=None) -> np.ndarray:
    """Each streamline as ``n_points`` points equally spaced along its length: (S, K, 3).

    Arc length is measured in mm when ``linear`` (voxel → mm 3×3) is given, else in voxels.
    A streamline of one point (or of zero length) repeats that point."""
    if n_points < 2:
        raise ValueError("a profile needs at least 2 points")
    points = np.asarray(points, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    n = len(lengths)
    if np.any(lengths == 0):
        raise ValueError("a streamline without points cannot be resampled")
    steps = np.diff(points, axis=0)
    if linear is not None:
        steps = steps @ np.asarray(linear, np.float64).T
    seg = np.linalg.norm(steps, axis=1) if len(points) > 1 else np.zeros(0)
    if len(seg):
        seg[offsets[1:-1] - 1] = 0.0  # the step from one streamline to the next is not a segment
    cumulative = np.concatenate([[0.0], np.cumsum(seg)])
    start, end = offsets[:-1], offsets[1:] - 1
    total = cumulative[end] - cumulative[start]
    t = np.linspace(0.0, 1.0, n_points)
    target = cumulative[start][:, None] + total[:, None] * t[None, :]  # (S, K)
    # the segment [i, i + 1] holding each target, kept within its own streamline
    i = np.searchsorted(cumulative, target, side="right") - 1
    i = np.clip(i, start[:, None], np.maximum(end - 1, start)[:, None])
    j = np.minimum(i + 1, end[:, None])
    span = cumulative[j] - cumulative[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(span > 0, (target - cumulative[i]) / span, 0.0)
    frac = np.clip(frac, 0.0, 1.0)[..., None]
    out = points[i] * (1.0 - frac) + points[j] * frac
    return out.reshape(n, n_points, 3)


def orient(resampled: np.ndarray, reference: np.ndarray | None = None, rounds: int = 3, linear=None) -> np.ndarray:
    """Bool per streamline: flip it so that all run the same way.

    Each streamline is compared with a reference course (K, 3) and with its reverse; it is
    flipped when the reverse is closer (mean point distance). Without a reference, the
    first streamline starts it and the flipped bundle's mean replaces it ``rounds`` times;
    then the whole bundle is turned, if needed, so that its mean course runs towards larger
    RAS coordinates along the axis it spans most (left → right, posterior → anterior,
    inferior → superior; ``linear`` maps voxel steps to mm), whichever streamline came first."""
    if len(resampled) == 0:
        return np.zeros(0, dtype=bool)
    ref = resampled[0] if reference is None else np.asarray(reference, dtype=np.float64)
    flip = np.zeros(len(resampled), dtype=bool)
    for _ in range(1 if reference is not None else rounds):
        same = np.linalg.norm(resampled - ref[None], axis=2).mean(axis=1)
        reverse = np.linalg.norm(resampled[:, ::-1] - ref[None], axis=2).mean(axis=1)
        flip = reverse < same
        oriented = np.where(flip[:, None, None], resampled[:, ::-1], resampled)
        ref = oriented.mean(axis=0)
    if reference is None:
        span = (ref[-1] - ref[0]) @ (np.eye(3) if linear is None else np.asarray(linear, np.float64)).T
        if span[np.argmax(np.abs(span))] < 0:
            flip = ~flip
    return flip


@dataclass
class Profile:
    """An along-tract profile: the weighted ``mean``, ``sd`` (the ddof 1 sd with equal weights; see
    :func:`weighted_profile`) and ``n`` (streamlines with a finite value) at each of K points, and ``course`` (K, 3): the bundle's mean course (voxel
    coordinates of the map's grid). ``values`` (S, K): every streamline's samples."""

    mean: np.ndarray
    sd: np.ndarray
    n: np.ndarray
    course: np.ndarray
    values: np.ndarray
    flipped: np.ndarray
    provenance: dict = field(default_factory=dict)


def node_weights(resampled: np.ndarray, weighting: str = ProfileParams.weighting) -> np.ndarray:
    """Weight of each streamline at each node, (S, K), summing to 1 over streamlines at a node.

    ``resampled`` (S, K, 3): oriented streamlines (any linear coordinates: the Mahalanobis
    distance does not depend on them). ``gaussian``: at node k the points ``p_sk`` of all
    streamlines have mean ``m_k`` and covariance ``C_k`` (ddof 0); the weight is
    ``1 / sqrt((p - m)ᵀ C⁺ (p - m))`` normalised over s, as DIPY's ``gaussian_weights`` which pyAFQ
    uses. Differences from DIPY, all where DIPY gives NaN or depends on round-off: ``C⁺`` is the
    pseudo-inverse of the full covariance (DIPY inverts its upper triangle; the two agree when the
    coordinates are uncorrelated), so a flat bundle (all streamlines in a plane) is measured within
    its plane; a streamline on the core shares the whole weight with any other on it; a node where
    all streamlines meet gives equal weights. ``none``: 1/S."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}: one of {', '.join(WEIGHTINGS)}")
    resampled = np.asarray(resampled, dtype=np.float64)
    n_streamlines, n_nodes = resampled.shape[:2]
    if n_streamlines == 0:
        return np.zeros((0, n_nodes))
    equal = np.full((n_streamlines, n_nodes), 1.0 / n_streamlines)
    if weighting == "none" or n_streamlines == 1:
        return equal
    delta = resampled - resampled.mean(axis=0)[None]  # (S, K, 3)
    covariance = np.einsum("ski,skj->kij", delta, delta) / n_streamlines  # (K, 3, 3), ddof 0
    scale = np.abs(covariance).reshape(n_nodes, -1).max(axis=1)
    inverse = np.linalg.pinv(covariance, rcond=1e-6, hermitian=True)
    squared = np.einsum("ski,kij,skj->sk", delta, inverse, delta)
    distance = np.sqrt(np.maximum(squared, 0.0))
    # round-off of coordinates (float32 points, an affine) is no spread: such nodes weigh equally
    spread = scale > (1e-10 * (1.0 + np.abs(resampled).max())) ** 2
    on_core = distance <= 1e-9
    with np.errstate(divide="ignore"):
        inverse_distance = np.where(on_core.any(axis=0)[None], on_core.astype(np.float64), 1.0 / distance)
    weights = inverse_distance / inverse_distance.sum(axis=0)[None]
    return np.where(spread[None], weights, equal)


def weighted_profile(values: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, sd, n)`` at each node of ``values`` (S, K; NaN where not sampled) with ``weights``
    (S, K): the weights of the finite values renormalised to 1; ``sd`` the weighted standard
    deviation with the reliability-weights correction ``1 / (1 - Σw²)`` (the ddof 1 sd when the
    weights are equal), NaN below 2 values."""
    finite = np.isfinite(values)
    n = finite.sum(axis=0)
    w = np.where(finite, weights, 0.0)
    total = w.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(total[None] > 0, w / total[None], 0.0)
        clean = np.where(finite, values, 0.0)
        mean = np.where(n > 0, (w * clean).sum(axis=0), np.nan)
        spread = (w * np.where(finite, (clean - mean[None]) ** 2, 0.0)).sum(axis=0)
        correction = 1.0 - (w * w).sum(axis=0)
        sd = np.where((n > 1) & (correction > 0), np.sqrt(spread / np.where(correction > 0, correction, 1.0)), np.nan)
    return mean, sd, n


def sample_map(nodes: np.ndarray, scalar_map: np.ndarray, device: str | Backend = "auto") -> np.ndarray:
    """Trilinear samples of ``scalar_map`` (3-D) at ``nodes`` (..., 3 voxel coordinates of its grid),
    NaN outside the grid (beyond half a voxel from the edge centres)."""
    backend = get_backend(device)
    shape_out = np.shape(nodes)[:-1]
    flat = np.asarray(nodes, dtype=np.float64).reshape(-1, 3)
    shape = np.asarray(scalar_map.shape[:3])
    inside = np.all((flat >= -0.5) & (flat < shape - 0.5), axis=1)
    field_ = backend.asarray(np.asarray(scalar_map, dtype=np.float32)[..., None])
    sampled = backend.to_host(trilinear(backend.xp, field_, backend.asarray(flat)))[:, 0].astype(np.float64)
    sampled[~inside] = np.nan
    return sampled.reshape(shape_out)


def profile(
    points: np.ndarray,
    offsets: np.ndarray,
    scalar_map: np.ndarray,
    n_points: int = ProfileParams.n_points,
    *,
    linear=None,
    reference: np.ndarray | None = None,
    weighting: str = ProfileParams.weighting,
    device: str | Backend = "auto",
) -> Profile:
    """Along-tract profile of ``scalar_map`` (3-D) over streamlines in its voxel coordinates.

    Samples outside the map's grid and NaN map values are left out of the mean (``n`` says
    how many streamlines count at each point)."""
    backend = get_backend(device)
    resampled = resample(points, offsets, n_points, linear)
    flipped = orient(resampled, reference, linear=linear)
    resampled = np.where(flipped[:, None, None], resampled[:, ::-1], resampled)
    values = sample_map(resampled, scalar_map, backend)
    mm = resampled if linear is None else resampled @ np.asarray(linear, np.float64).T
    mean, sd, n = weighted_profile(values, node_weights(mm, weighting))
    course = resampled.mean(axis=0) if len(resampled) else np.zeros((n_points, 3))
    provenance = {"backend": backend.name, "device": backend.device_name, "points": int(n_points),
                  "weighting": weighting}  # fmt: skip
    return Profile(mean, sd, n, course, values, flipped, provenance)


# ---------------------------------------------------------------- distance to a region


def nearest_region_voxels(xp, mask, voxel_size) -> object:
    """(3, X, Y, Z) int index of the region voxel whose centre is nearest to each voxel's
    centre (in mm, anisotropic voxels), by the exact Euclidean distance transform."""
    inverted = ~mask.astype(bool)
    sampling = tuple(float(v) for v in voxel_size)
    if xp is np:
        from scipy import ndimage

        return ndimage.distance_transform_edt(inverted, sampling=sampling, return_distances=False, return_indices=True)
    try:
        from cupyx.scipy import ndimage as cundimage

        return cundimage.distance_transform_edt(
            inverted, sampling=sampling, return_distances=False, return_indices=True
        )
    except (ImportError, NotImplementedError, TypeError):  # an older CuPy: on the host, then upload
        from scipy import ndimage

        host = ndimage.distance_transform_edt(
            xp.asnumpy(inverted), sampling=sampling, return_distances=False, return_indices=True
        )
        return xp.asarray(host)


def point_distances(xp, points, mask, features, linear):
    """Distance in mm from each point (N, 3 voxel coordinates, float64) to the region: to the
    nearest (inscribed ellipsoid of the) region voxels nearest to the eight voxels around
    it; 0 in a region voxel."""
    shape = xp.asarray(mask.shape, dtype=xp.int64)
    lin = xp.asarray(np.asarray(linear, dtype=np.float64))
    low = xp.floor(points).astype(xp.int64)
    best = xp.full(len(points), np.inf)
    for corner in np.ndindex(2, 2, 2):
        voxel = xp.clip(low + xp.asarray(corner, dtype=xp.int64), 0, shape - 1)
        nearest = features[:, voxel[:, 0], voxel[:, 1], voxel[:, 2]].T  # (N, 3)
        in_voxels = nearest.astype(xp.float64) - points
        diff = in_voxels @ lin.T
        mm = xp.sqrt((diff * diff).sum(axis=1))
        voxels = xp.sqrt((in_voxels * in_voxels).sum(axis=1))
        # less half a voxel along the way to the centre: 0.5 voxel lengths of this direction, in mm
        edge = mm * (1.0 - 0.5 / xp.maximum(voxels, 0.5))
        best = xp.minimum(best, edge)
    own = xp.floor(points + 0.5).astype(xp.int64)
    inside = xp.all((own >= 0) & (own < shape), axis=1)
    own = xp.clip(own, 0, shape - 1)
    in_region = inside & mask[own[:, 0], own[:, 1], own[:, 2]]
    return xp.where(in_region, 0.0, best)


def _segments(xp, points, offsets, linear):
    """Index of each segment's first point (segments within a streamline), its streamline and
    its length in mm."""
    owner_of_point = xp.searchsorted(offsets[1:], xp.arange(len(points)), side="right")
    if len(points) < 2:
        empty = xp.zeros(0, dtype=xp.int64)
        return empty, empty, owner_of_point, xp.zeros(0)
    seg_start = xp.arange(len(points) - 1)
    seg_start = seg_start[owner_of_point[seg_start] == owner_of_point[seg_start + 1]]
    step = (points[seg_start + 1] - points[seg_start]) @ xp.asarray(np.asarray(linear, np.float64)).T
    return seg_start, owner_of_point[seg_start], owner_of_point, xp.sqrt((step * step).sum(axis=1))


def _densify(xp, points, seg_start, seg_owner, seg_mm, step_mm):
    """Samples at most ``step_mm`` apart along the given segments (each one's first point
    included, its last not), in segment order, and the streamline of each."""
    a, b = points[seg_start], points[seg_start + 1]
    pieces = xp.maximum(1, xp.ceil(seg_mm / step_mm).astype(xp.int64))
    ends = xp.cumsum(pieces)
    total = int(ends[-1]) if len(ends) else 0
    if total == 0:
        return xp.zeros((0, 3)), xp.zeros(0, dtype=xp.int64)
    seg_of = xp.searchsorted(ends, xp.arange(total), side="right")
    within = xp.arange(total) - (ends - pieces)[seg_of]
    t = (within / pieces[seg_of])[:, None]
    return a[seg_of] * (1.0 - t) + b[seg_of] * t, seg_owner[seg_of]


def _segment_min(xp, values, owner, n):
    """Minimum of ``values`` per owner (``owner`` ascending); inf for an owner without values."""
    out = xp.full(n, np.inf)
    if len(values) == 0:
        return out
    if xp is np:
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]])
        out[owner[starts]] = np.minimum.reduceat(values, starts)
    elif hasattr(xp.minimum, "at"):  # CuPy >= 13
        xp.minimum.at(out, owner, values)
    else:
        import cupyx

        cupyx.scatter_min(out, owner, values)
    return out


@dataclass
class RegionDistance:
    """Distances in mm to a region: ``per_point`` (P,) at every streamline point, ``per_streamline``
    (S,) the minimum along each streamline (its segments sampled ``step_mm`` apart)."""

    per_point: np.ndarray
    per_streamline: np.ndarray
    provenance: dict = field(default_factory=dict)


def region_distance(
    points: np.ndarray,
    offsets: np.ndarray,
    mask: np.ndarray,
    linear: np.ndarray,
    *,
    step_mm: float | None = None,
    device: str | Backend = "auto",
    progress=None,
    cancelled=None,
) -> RegionDistance:
    """Distance of every streamline (points in voxel coordinates of ``mask``'s grid) to the region."""
    backend = get_backend(device)
    xp = backend.xp
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        raise ValueError("the region is empty: there is nothing to measure the distance to")
    linear = np.asarray(linear, dtype=np.float64)
    voxel_size = np.sqrt((linear**2).sum(axis=0))
    if step_mm is None:
        step_mm = 0.25 * float(voxel_size.min())
    if not step_mm > 0:
        raise ValueError("the sampling step must be > 0 mm")
    offsets = np.asarray(offsets, dtype=np.int64)
    n = len(offsets) - 1
    device_mask = backend.asarray(mask)
    features = nearest_region_voxels(xp, device_mask, voxel_size)
    per_point = np.empty(len(points), dtype=np.float32)
    per_streamline = np.full(n, np.inf)
    lengths = np.diff(offsets)
    seg_mm = np.linalg.norm(np.diff(np.asarray(points, np.float64), axis=0) @ linear.T, axis=1)
    if len(seg_mm):
        seg_mm[offsets[1:-1][offsets[1:-1] > 0] - 1] = 0.0  # jumps between streamlines
    # working memory per streamline: its points and its samples (about 200 bytes each)
    samples_per = (lengths.sum() + (seg_mm / step_mm).sum() + n) / max(n, 1)
    per_item = int(400 * (samples_per + 1))

    slack = 0.5 * float(np.linalg.norm(linear, axis=0).max())

    def work(start, stop):
        p0, p1 = offsets[start], offsets[stop]
        # float32 over the bus (the points' own precision), float64 on the device
        pts = backend.asarray(np.asarray(points[p0:p1], dtype=np.float32)).astype(xp.float64)
        local = backend.asarray(offsets[start : stop + 1] - p0)
        at_points = point_distances(xp, pts, device_mask, features, linear)
        seg_start, seg_owner, owner_of_point, seg_mm = _segments(xp, pts, local, linear)
        mins = _segment_min(xp, at_points, owner_of_point, stop - start)
        # Only segments that may come closer than the streamline's points are sampled: along a
        # segment of length L between points at distances a and b the distance stays above
        # (a + b - L) / 2 (1-Lipschitz), less ``slack`` for the step at a region voxel's face.
        bound = 0.5 * (at_points[seg_start] + at_points[seg_start + 1] - seg_mm) - slack
        need = bound < mins[seg_owner]
        samples, owner = _densify(xp, pts, seg_start[need], seg_owner[need], seg_mm[need], step_mm)
        if len(samples):
            mins = xp.minimum(
                mins, _segment_min(xp, point_distances(xp, samples, device_mask, features, linear), owner, stop - start)
            )
        return start, stop, backend.to_host(at_points.astype(xp.float32)), backend.to_host(mins)

    for start, stop, at_points, mins in iter_batched(
        backend, n, per_item, work, progress=progress, cancelled=cancelled, maximum=200_000
    ):
        per_point[offsets[start] : offsets[stop]] = at_points
        per_streamline[start:stop] = mins
    provenance = {"backend": backend.name, "device": backend.device_name, "step_mm": float(step_mm)}
    return RegionDistance(per_point, per_streamline, provenance)
