"""Streamlines as one ragged array (points plus offsets, the trx-python / ArraySequence layout),
in voxel coordinates of a grid, with per-point and per-streamline scalars.

A tractogram read from an uncompressed ``.trx`` keeps its positions where they are: the file's
RAS millimetres, memory-mapped (:class:`MappedPoints`). Its voxel coordinates (``points``) are
made the first time something reads them, once, and shared by every copy of the tractogram; what
needs only some of them (a level of detail, a chunk) reads those (:meth:`Tractogram.points_rows`,
:meth:`Tractogram.points_take`), and the 3-D view draws the millimetres as they are. Opening a
whole-brain tractogram therefore reads no point it does not show.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .grid import Grid
from .observable import Observable


def first_column(values, rows: int) -> np.ndarray:
    """The first column of a per-point or per-streamline scalar ((rows,) or (rows, k)) as float64.

    ``reshape(rows, -1)`` cannot tell the width of 0 values, so an empty tractogram (an
    ordinary result) needs its own case."""
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(rows, -1)[:, 0] if rows else np.zeros(0)


class MappedPoints:
    """Streamline points kept as a file stores them: ``world`` (P, 3) RAS millimetres, a memory
    map (float16/32/64), and ``to_voxel`` (4 x 4) the voxel -> RAS inverse of the tractogram's
    grid. :meth:`voxels` converts all of them once (with ``convert(world, to_voxel)``, the
    reader's own conversion, so the values are the reader's) and keeps the result; rows and
    gathers convert only what they read (and ``release(world)`` drops the pages a gather read). Thread-safe; shallow copies of a tractogram share it.

    ``check``: the file's positions were not checked when it was opened (a window draws first and
    checks after: :func:`app.loaders.check_opened`); ``check()`` says whether they are finite and
    fit the grid, run once by :meth:`positions_fit` (a conversion refuses non-finite values anyway)."""

    def __init__(
        self,
        world,
        to_voxel: np.ndarray,
        convert: Callable[[object, np.ndarray], np.ndarray | None],
        release: Callable[[object], object] | None = None,
        reader=None,
        check: Callable[[], bool] | None = None,
    ):
        self.world = world
        self.to_voxel = np.asarray(to_voxel, dtype=np.float64)
        self._convert = convert
        self._release = release  # drops the map's pages a gather read from the resident set
        #: what rows are read from to be converted (``reader[a:b]``: an array): the file opened
        #: when it was mapped (a file replaced or removed since is still the one read), or ``world``
        self.reader = world if reader is None else reader
        self._voxels: np.ndarray | None = None
        self._last_take: tuple | None = None  # (index array, its points): read-only, shared
        self._lock = threading.Lock()
        self._check, self._fits = check, None if check is not None else True
        self._check_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.world)

    @property
    def checked(self) -> bool:
        """Have the positions been checked (when the file was opened, or since)?"""
        return self._fits is not None

    def positions_fit(self) -> bool:
        """Are the file's positions finite and within what the grid's voxel coordinates hold?
        Checked on the first call when the open left it for later (others wait for it)."""
        with self._check_lock:
            if self._fits is None:
                self._fits = bool(self._check())
            return self._fits

    def __getstate__(self) -> dict:
        """Pickled (a process pool, a deep copy) as arrays: the file's points copied, as NumPy
        pickles a memory map (checked first, when that was left for later); the voxel
        coordinates if made."""
        return {"world": np.asarray(self.world), "to_voxel": self.to_voxel, "convert": self._convert,
                "release": self._release, "voxels": self._voxels, "fits": self.positions_fit()}  # fmt: skip

    def __setstate__(self, state: dict) -> None:
        fits = state.get("fits", True)
        self.__init__(state["world"], state["to_voxel"], state["convert"], state["release"],
                      check=None if fits else lambda: False)  # fmt: skip
        self._voxels = state["voxels"]

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of the voxel coordinates (those of the file's points)."""
        return (len(self.world), 3)

    dtype = np.dtype(np.float32)  # of the voxel coordinates

    @property
    def made(self) -> bool:
        """Have the voxel coordinates of every point been made (and kept)?"""
        return self._voxels is not None

    def voxels(self) -> np.ndarray:
        """Every point in voxel coordinates, float32 (made on the first call, then kept)."""
        with self._lock:
            if self._voxels is None:
                self._voxels = self._converted(self.reader)
            return self._voxels

    def _converted(self, world_rows) -> np.ndarray:
        out = self._convert(world_rows, self.to_voxel)
        if out is None:  # the reader checked the whole file when it opened it
            raise ValueError("non-finite streamline points in a mapped tractogram")
        return out

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Points ``start:stop`` in voxel coordinates (float32)."""
        if self._voxels is not None:
            return self._voxels[start:stop]
        return self._converted(np.asarray(self.reader[start:stop]))

    def take(self, index: np.ndarray) -> np.ndarray:
        """Points ``index`` in voxel coordinates (float32; read-only: the last array returned again
        when asked for the same ``index`` object)."""
        if self._voxels is not None:
            return self._voxels[index]
        last = self._last_take
        if last is not None and last[0] is index:  # the same level read again (its colours): not twice
            return last[1]
        take_runs = getattr(self.reader, "take_runs", None)  # the file read run by run (whole streamlines)
        gathered = None if take_runs is None else take_runs(index)
        if gathered is None:  # scattered rows: through the map, whose pages are dropped after
            gathered = np.asarray(self.world[index])
            if self._release is not None:
                self._release(self.world)
        out = self._converted(gathered)
        self._last_take = (index, out)
        return out


@dataclass
class Tractogram(Observable):
    """Streamlines as one ragged array: ``points`` (P, 3) and ``offsets`` (S + 1,).

    Streamline ``i`` is ``points[offsets[i]:offsets[i + 1]]``, in voxel index
    coordinates of the grid described by ``affine`` (voxel -> RAS mm) and
    ``dimensions``. ``point_scalars`` hold (P,) or (P, k) arrays,
    ``streamline_scalars`` (S,) or (S, k) arrays.

    ``points`` may be given as :class:`MappedPoints` (a file's millimetres): ``points`` is then
    made when first read (:attr:`mapped` says so; :attr:`n_points` never makes it).
    """

    points: np.ndarray = field(repr=False)
    offsets: np.ndarray
    affine: np.ndarray = field(default_factory=lambda: np.eye(4))
    dimensions: tuple[int, int, int] = (1, 1, 1)
    point_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    streamline_scalars: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "tractogram"
    source: str = ""  # the file it was read from ("" when computed)

    def __post_init__(self) -> None:
        Observable.__init__(self)
        if self.mapped is None:
            self.points = np.asarray(self.points, dtype=np.float32).reshape(-1, 3)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.affine = np.asarray(self.affine, dtype=np.float64)
        self.dimensions = tuple(int(d) for d in self.dimensions)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must start at 0")
        stored = len(self.points) if self.mapped is None else len(self.mapped)  # the mapped: none converted
        if self.offsets[-1] != stored or np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing and end at the number of points")
        for key, values in self.point_scalars.items():
            if len(values) != self.n_points:
                raise ValueError(f"point scalar {key!r} has {len(values)} values for {self.n_points} points")
        for key, values in self.streamline_scalars.items():
            if len(values) != len(self):
                raise ValueError(f"streamline scalar {key!r} has {len(values)} values for {len(self)} streamlines")

    @classmethod
    def from_list(cls, streamlines, **kwargs) -> Tractogram:
        lengths = [len(s) for s in streamlines]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        points = (
            np.concatenate([np.asarray(s, np.float32).reshape(-1, 3) for s in streamlines])
            if streamlines
            else np.zeros((0, 3), np.float32)
        )
        return cls(points, offsets, **kwargs)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_points(self) -> int:
        """The number of points (reads none; the offsets end there, checked when made)."""
        return int(self.offsets[-1])

    @property
    def mapped(self) -> MappedPoints | None:
        """The file's memory-mapped millimetres behind ``points`` (None: ``points`` is an array)."""
        return self.__dict__.get("_mapped")

    def points_rows(self, start: int, stop: int) -> np.ndarray:
        """``points[start:stop]`` (float32 voxel coordinates) without making the others."""
        mapped = self.mapped
        return self.points[start:stop] if mapped is None else mapped.rows(start, stop)

    def points_take(self, index: np.ndarray) -> np.ndarray:
        """``points[index]`` (float32 voxel coordinates) without making the others."""
        mapped = self.mapped
        return self.points[index] if mapped is None else mapped.take(np.asarray(index))

    def __getitem__(self, i: int) -> np.ndarray:
        return self.points_rows(int(self.offsets[i]), int(self.offsets[i + 1]))

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    @property
    def lengths(self) -> np.ndarray:
        """Number of points per streamline."""
        return np.diff(self.offsets)

    def points_on(self, affine: np.ndarray, dtype=np.float64) -> np.ndarray:
        """The points in voxel coordinates of another grid (``affine``: its voxel -> RAS mm)."""
        return on_grid(self.points, np.linalg.solve(affine, self.affine), dtype)

    def meets(self, affine: np.ndarray, shape: tuple[int, ...], sample: int = 200_000) -> bool:
        """Whether any point (of an even sample of at most ``sample``) lies inside the grid of
        ``affine`` and ``shape``: a tractogram and an image of different spaces do not meet."""
        n = len(self.points)
        if n == 0:
            return False
        index = np.unique(np.linspace(0, n - 1, min(n, sample)).astype(np.int64))
        voxels = on_grid(self.points_take(index), np.linalg.solve(affine, self.affine), np.float64)
        return bool(Grid(affine, tuple(shape[:3])).contains(voxels).any())

    def ends_on(self, affine: np.ndarray, dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
        """Each streamline's first and last point in voxel coordinates of another grid, as
        ``(points, offsets)`` of streamlines of two points (none for an empty streamline): what an
        end assignment reads (a connectome), without converting every point of a whole brain."""
        lengths = self.lengths
        has = lengths > 0
        index = np.stack([self.offsets[:-1][has], self.offsets[1:][has] - 1], axis=1).reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(np.where(has, 2, 0))]).astype(np.int64)
        return on_grid(self.points_take(index), np.linalg.solve(affine, self.affine), dtype), offsets

    def subset(self, keep: np.ndarray, name: str | None = None) -> Tractogram:
        """The streamlines where ``keep`` (bool mask or indices) holds, scalars included."""
        index = np.flatnonzero(keep) if np.asarray(keep).dtype == bool else np.asarray(keep, dtype=np.int64)
        lengths = self.lengths[index]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        owner = np.repeat(index, lengths)
        within = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
        point_index = self.offsets[owner] + within
        return Tractogram(
            self.points_take(point_index),
            offsets,
            self.affine,
            self.dimensions,
            {k: np.asarray(v)[point_index] for k, v in self.point_scalars.items()},
            {k: np.asarray(v)[index] for k, v in self.streamline_scalars.items()},
            name=name or self.name,
        )

    @classmethod
    def concatenate(cls, tracts: list[Tractogram], name: str | None = None) -> Tractogram:
        """Streamlines of several tractograms on one grid, one after another (shared scalars kept)."""
        if not tracts:
            raise ValueError("nothing to concatenate")
        first = tracts[0]
        starts = np.cumsum([0] + [t.n_points for t in tracts[:-1]])
        offsets = np.concatenate([[0]] + [t.offsets[1:] + s for t, s in zip(tracts, starts)]).astype(np.int64)
        point_keys = set.intersection(*(set(t.point_scalars) for t in tracts))
        stream_keys = set.intersection(*(set(t.streamline_scalars) for t in tracts))
        return cls(
            np.concatenate([t.points for t in tracts]),
            offsets,
            first.affine,
            first.dimensions,
            {k: np.concatenate([np.asarray(t.point_scalars[k]) for t in tracts]) for k in point_keys},
            {k: np.concatenate([np.asarray(t.streamline_scalars[k]) for t in tracts]) for k in stream_keys},
            name=name or first.name,
        )

    def points_world(self) -> np.ndarray:
        """All points in RAS mm (float32, like the points)."""
        rotation = self.affine[:3, :3].T.astype(np.float32)
        return self.points @ rotation + self.affine[:3, 3].astype(np.float32)

    def __eq__(self, other) -> bool:  # dataclass eq would compare arrays ambiguously
        return self is other

    __hash__ = object.__hash__


def _get_points(self: Tractogram) -> np.ndarray:
    mapped = self.__dict__.get("_mapped")
    return self.__dict__["_points"] if mapped is None else mapped.voxels()


def _set_points(self: Tractogram, value) -> None:
    if isinstance(value, MappedPoints):
        self.__dict__["_mapped"], self.__dict__["_points"] = value, None
    else:
        self.__dict__["_mapped"], self.__dict__["_points"] = None, value


#: ``points``: the array, or a :class:`MappedPoints`' voxel coordinates made when first read.
Tractogram.points = property(_get_points, _set_points)  # type: ignore[assignment]


def on_grid(points: np.ndarray, to_grid: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Voxel coordinates ``points`` (N, 3) mapped by ``to_grid`` (4×4: this grid's voxels -> another
    grid's voxels), computed in float64, as ``dtype``."""
    return (np.asarray(points).astype(np.float64) @ to_grid[:3, :3].T + to_grid[:3, 3]).astype(dtype, copy=False)
