"""The protocol regions of :mod:`.protocols` (boxes and spheres in MNI mm) as masks on a subject grid,
inside its brain mask (a region outside the brain takes no part in tracking).

Every brain voxel is placed in MNI space through the registration (``Registration.to_template``:
the affine and, for SyN, the inverse displacement field), so the regions follow the subject's
anatomy however it was registered. A voxel joins a region when at least ``threshold`` of it lies
inside: voxels well inside or well outside a shape (by half a voxel diagonal, with room for the
warp's local stretch) are decided at their centre, those on its edge at 2 × 2 × 2 points.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..grid import Grid
from ..registration import Registration
from .protocols import Protocol, Shape

#: Offsets (voxels) of the 2 × 2 × 2 points at which an edge voxel is sampled.
SUB_POINTS = np.array([[x, y, z] for x in (-0.25, 0.25) for y in (-0.25, 0.25) for z in (-0.25, 0.25)])
#: Room for the registration's local stretch when deciding a voxel at its centre.
STRETCH = 1.5


@dataclass
class ProtocolMasks:
    """One bundle's regions on the subject grid."""

    seed: np.ndarray
    targets: list[np.ndarray]
    exclude: np.ndarray | None
    stop: np.ndarray | None
    voxels: dict[str, int] = field(default_factory=dict)  # region -> voxels (inside the brain)


class SubjectInMni:
    """The MNI coordinates of a subject grid's voxels inside ``within`` (the brain: regions matter
    nowhere else, and an HCP grid holds 3.7 M voxels for its 1 M of brain), through ``registration``."""

    def __init__(self, registration: Registration, grid: Grid, within: np.ndarray | None = None):
        if registration.template != "mni" or registration.template_side not in ("fixed", "moving"):
            where = registration.folder or "the registration"
            raise InputError(
                "this registration does not join the subject to the MNI template",
                path=where,
                fix="Register the subject to MNI first: tractlens register DWI mni --type syn -o DIR",
            )
        self.registration = registration
        self.grid = grid
        within = np.ones(grid.shape, dtype=bool) if within is None else np.asarray(within, dtype=bool)
        self.within = within
        self.voxels = np.flatnonzero(within.ravel())  # flat indices of the voxels considered
        self.ijk = np.stack(np.unravel_index(self.voxels, grid.shape), axis=1).astype(np.float64)
        self.centres = self._to_mni(self.ijk)
        self._columns = [np.ascontiguousarray(self.centres[:, k]) for k in range(3)]  # fast per-axis arithmetic
        self.half_diagonal = 0.5 * float(np.linalg.norm(grid.voxel_sizes)) * STRETCH
        self._eighths: dict[Shape, np.ndarray | Future] = {}  # per shape warped (or being warped)

    def _to_mni(self, ijk: np.ndarray) -> np.ndarray:
        return self.registration.to_template(self.grid.to_mm(ijk))

    def prefetch(self, shapes, executor) -> None:
        """Warp ``shapes`` on ``executor``'s threads ahead of need (NumPy lets go of the GIL for
        its array work): the later bundles' regions are made while the earlier ones are tracked."""
        for shape in shapes:
            if shape not in self._eighths:
                self._eighths[shape] = executor.submit(self._shape_eighths, shape)

    def shape_fraction(self, shape: Shape) -> np.ndarray:
        """Per voxel considered, the share of it inside ``shape`` (0, 1 or k/8 on the edge). Each
        shape is warped once per run, as exclusion shapes recur from bundle to bundle."""
        kept = self._eighths.get(shape)
        if kept is None:
            kept = self._eighths[shape] = self._shape_eighths(shape)
        elif isinstance(kept, Future):
            kept = self._eighths[shape] = kept.result()
        return kept.astype(np.float32) / np.float32(len(SUB_POINTS))

    def _shape_eighths(self, shape: Shape) -> np.ndarray:
        """Per voxel considered, how many of its 8 sub-points lie inside ``shape`` (uint8; 8 for a
        voxel well inside, decided at its centre)."""
        # per axis on contiguous columns (an (N, 3) reduction along its short axis is several times slower)
        x, y, z = self._columns
        if shape.kind == "box":
            (ax, ay, az), (bx, by, bz) = shape.a, shape.b
            signed = np.maximum(np.maximum(ax - x, x - bx), np.maximum(ay - y, y - by))
            signed = np.maximum(signed, np.maximum(az - z, z - bz))
        else:
            cx, cy, cz = shape.a
            signed = np.sqrt((x - cx) ** 2 + (y - cy) ** 2 + (z - cz) ** 2) - float(shape.b)
        eighths = (signed <= -self.half_diagonal).astype(np.uint8) * np.uint8(len(SUB_POINTS))
        edge = np.flatnonzero(np.abs(signed) < self.half_diagonal)
        if edge.size:
            points = self._to_mni((self.ijk[edge][:, None, :] + SUB_POINTS[None]).reshape(-1, 3))
            eighths[edge] = shape.contains(points).reshape(len(edge), len(SUB_POINTS)).sum(axis=1)
        return eighths

    def region_mask(self, region, threshold: float) -> np.ndarray | None:
        """The union of the region's shapes on the grid (None for a region without shapes)."""
        if not region:
            return None
        inside = np.zeros(len(self.voxels), dtype=bool)
        for shape in region:
            inside |= self.shape_fraction(shape) >= threshold
        mask = np.zeros(self.grid.n_voxels, dtype=bool)
        mask[self.voxels[inside]] = True
        return mask.reshape(self.grid.shape)


def protocol_masks(protocol: Protocol, subject: SubjectInMni, brain: np.ndarray, threshold: float) -> ProtocolMasks:
    """The bundle's seed, targets, exclusion and stop masks on the subject grid, with how many
    brain voxels each holds (``voxels``: 'seed', 'target 1', …)."""
    seed = subject.region_mask(protocol.seed, threshold)
    targets = [subject.region_mask(t, threshold) for t in protocol.targets]
    exclude = subject.region_mask(protocol.exclude, threshold)
    stop = subject.region_mask(protocol.stop, threshold)
    # the masks hold brain voxels only when ``brain`` is the subject's ``within``: counted without a pass over the grid
    inside = brain is subject.within or np.array_equal(brain, subject.within)

    def count(mask: np.ndarray) -> int:
        return int(np.count_nonzero(mask)) if inside else int(np.count_nonzero(mask & brain))

    voxels = {"seed": count(seed)}
    voxels.update({f"target {i + 1}": count(t) for i, t in enumerate(targets)})
    if exclude is not None:
        voxels["exclude"] = count(exclude)
    if stop is not None:
        voxels["stop"] = count(stop)
    return ProtocolMasks(seed, targets, exclude, stop, voxels)


def missed_regions(masks: ProtocolMasks) -> list[str]:
    """The regions a streamline needs (seed, targets) that hold no brain voxel on the subject."""
    return [
        name for name, count in masks.voxels.items() if count == 0 and (name == "seed" or name.startswith("target"))
    ]
