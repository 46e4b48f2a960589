"""The named-bundle protocols: seed, target, exclusion and stop regions in MNI space.

The protocols are data, shipped as ``tractlens/resources/bundles/protocols.json`` with a
``protocols_version``: per bundle its regions as boxes and spheres in MNI mm, the published
protocol it follows (XTRACT, Warrington et al. 2020) and what was adapted. A lateralised bundle
is written once for the left hemisphere; the right one is its mirror image (x → −x), named
``NAME_R`` beside ``NAME_L``. Regions are unions of shapes; each target is a waypoint that a
kept streamline must pass (all of them), the exclusion a region it must never enter, the stop
a region where it ends (probtrackx's ``--waypoints``, ``--avoid``, ``--stop``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

from ..errors import InputError

PROTOCOL_FILE = ("bundles", "protocols.json")
SIDES = ("L", "R")


@dataclass(frozen=True)
class Shape:
    """A box (``low``, ``high`` corners) or a sphere (``centre``, ``radius``) in MNI mm."""

    kind: str  # 'box' | 'sphere'
    a: tuple[float, float, float]  # box: low corner; sphere: centre
    b: tuple[float, float, float] | float  # box: high corner; sphere: radius (mm)

    @classmethod
    def parse(cls, spec: dict) -> Shape:
        if "box" in spec:
            low, high = (tuple(float(v) for v in corner) for corner in spec["box"])
            return cls(
                "box", tuple(min(lo, hi) for lo, hi in zip(low, high)), tuple(max(lo, hi) for lo, hi in zip(low, high))
            )
        if "sphere" in spec:
            return cls("sphere", tuple(float(v) for v in spec["sphere"]), float(spec["r"]))
        raise ValueError(f"unknown region shape {spec!r}")

    def mirrored(self) -> Shape:
        if self.kind == "box":
            low, high = self.a, self.b
            return Shape("box", (-high[0], low[1], low[2]), (-low[0], high[1], high[2]))
        return Shape("sphere", (-self.a[0], self.a[1], self.a[2]), self.b)

    def contains(self, points_mm: np.ndarray) -> np.ndarray:
        """Which of the (N, 3) MNI points lie inside."""
        p = np.asarray(points_mm, dtype=np.float64)
        if self.kind == "box":
            return np.all((p >= np.asarray(self.a)) & (p <= np.asarray(self.b)), axis=-1)
        return ((p - np.asarray(self.a)) ** 2).sum(axis=-1) <= float(self.b) ** 2

    def describe(self) -> dict:
        if self.kind == "box":
            return {"box": [list(self.a), list(self.b)]}
        return {"sphere": list(self.a), "r": self.b}


Region = tuple[Shape, ...]


def region_contains(region: Region, points_mm: np.ndarray) -> np.ndarray:
    inside = np.zeros(len(points_mm), dtype=bool)
    for shape in region:
        inside |= shape.contains(points_mm)
    return inside


@dataclass(frozen=True)
class Protocol:
    """One named bundle (one side of a lateralised one)."""

    name: str  # e.g. 'CST_L', 'FMA'
    title: str
    colour: tuple[float, float, float]
    source: str  # key of the citation
    citation: str
    protocol: str  # the published protocol it follows, e.g. 'XTRACT cst'
    adapted: str
    seed: Region
    targets: tuple[Region, ...]
    exclude: Region
    stop: Region
    course: np.ndarray = field(repr=False, compare=False)  # (K, 3) MNI mm, the phantom's curve only

    def shapes(self) -> list[Shape]:
        """Every shape of its regions, in the order they are made into masks (seed, targets, exclusion, stop)."""
        return [shape for region in (self.seed, *self.targets, self.exclude, self.stop) for shape in region or ()]

    def regions(self) -> dict:
        """The regions as written in bundles.json and printed by ``--list``."""
        return {
            "seed": [s.describe() for s in self.seed],
            "targets": [[s.describe() for s in target] for target in self.targets],
            "exclude": [s.describe() for s in self.exclude],
            "stop": [s.describe() for s in self.stop],
            "space": "MNI152 mm",
        }

    def record(self, version: str) -> dict:
        return {
            "source": self.protocol,
            "citation": self.citation,
            "adapted": self.adapted,
            "protocols_version": version,
            "regions": self.regions(),
        }


@dataclass(frozen=True)
class ProtocolSet:
    version: str
    adaptation: str
    protocols: dict[str, Protocol]


def _region(specs) -> Region:
    return tuple(Shape.parse(spec) for spec in specs)


def _side(shapes: Region, side: str) -> Region:
    return shapes if side == "L" else tuple(s.mirrored() for s in shapes)


@lru_cache(maxsize=1)
def load_protocols() -> ProtocolSet:
    """The shipped protocols, both sides of the lateralised ones, in file order (L before R)."""
    text = resources.files("tractlens.resources").joinpath(*PROTOCOL_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    citations = data["citations"]
    protocols: dict[str, Protocol] = {}
    for entry in data["bundles"]:
        base = {
            "seed": _region(entry["seed"]),
            "targets": tuple(_region(t) for t in entry["targets"]),
            "exclude": _region(entry.get("exclude", [])),
            "stop": _region(entry.get("stop", [])),
        }
        course = np.asarray(entry["course"], dtype=np.float64)
        for side in SIDES if entry["lateral"] else (None,):
            name = f"{entry['name']}_{side}" if side else entry["name"]
            where = side or "L"
            protocols[name] = Protocol(
                name=name,
                title=entry["title"] + {"L": " (left)", "R": " (right)"}.get(side or "", ""),
                colour=tuple(float(c) for c in entry["colour"]),
                source=entry["source"],
                citation=citations[entry["source"]],
                protocol=entry["protocol"] + (f" ({side.lower()})" if side else ""),
                adapted=entry["adapted"] + ("" if where == "L" else " Mirror image of the left protocol (x → −x)."),
                seed=_side(base["seed"], where),
                targets=tuple(_side(t, where) for t in base["targets"]),
                exclude=_side(base["exclude"], where),
                stop=_side(base["stop"], where),
                course=course if where == "L" else course * np.array([-1.0, 1.0, 1.0]),
            )
    return ProtocolSet(str(data["protocols_version"]), str(data["adaptation"]), protocols)


def protocols_version() -> str:
    return load_protocols().version


def bundle_names() -> list[str]:
    """Every named bundle, in the protocol file's order (``CST_L``, ``CST_R``, …, ``FMA``, ``FMI``)."""
    return list(load_protocols().protocols)


def bundle_colour(name: str) -> tuple[float, float, float]:
    """The bundle's standard colour, (r, g, b) in 0..1; the right side a little lighter than the left."""
    protocol = protocol_of(name)
    r, g, b = protocol.colour
    if name.endswith("_R"):
        return tuple(round(c + (1.0 - c) * 0.25, 4) for c in (r, g, b))
    return (r, g, b)


def protocol_of(name: str) -> Protocol:
    protocols = load_protocols().protocols
    if name not in protocols:
        raise InputError(
            f"there is no bundle named {name!r}",
            fix=f"Choose among: {', '.join(protocols)} (tractlens bundles --list)",
        )
    return protocols[name]


def choose_bundles(names) -> list[str]:
    """The bundles to track from ``names`` (None, 'all' or a list / comma-separated text of
    names), in the protocol file's order, without repeats; InputError naming an unknown one."""
    every = bundle_names()
    if names is None:
        return every
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",")]
    names = [n for n in names if n]
    if not names:
        raise InputError("no bundle was named", fix="Give --bundles all or names such as CST_L,AF_L")
    if any(n.lower() == "all" for n in names):
        return every
    for name in names:
        protocol_of(name)  # raises for an unknown name
    return [n for n in every if n in set(names)]
