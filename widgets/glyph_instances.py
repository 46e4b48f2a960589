"""Tensor glyphs as GPU instances: a few source meshes, per-glyph arrays only.

A slice step used to rebuild one mesh of every glyph's vertices, normals and colours (80 vertices
a glyph: seconds for a whole slice at 1.25 mm). Here a glyph is a centre, a rotation
(quaternion of its eigenvectors), three radii (its eigenvalues, scaled) and a colour; VTK's
``vtkGlyph3DMapper`` draws one source mesh per glyph with those (OpenGL instancing), so a slice
step only computes and sends those small per-instance arrays.

The source meshes are unit superquadrics (Kindlmann 2004, see :mod:`widgets.glyphs`) on a grid
of :data:`SHAPE_BINS` × :data:`SHAPE_BINS` values of (cl, cp), for the linear (round about x) and
the planar (round about z) case, with their exact normals: a glyph takes the source of its
(cl, cp) bin (its shape to within half a bin), an ellipsoid layer the one unit sphere.
"""

from __future__ import annotations

import functools

import numpy as np
import pyvista as pv
from vtkmodules.vtkRenderingCore import vtkActor, vtkGlyph3DMapper

from tractlens.app.display_data import fractional_anisotropy, tensor_eigen

SHAPE_BINS = 6  # bins of cl and of cp: 2 × 6 × 6 source meshes for superquadrics


def _spow(x: np.ndarray, power: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.abs(x) ** power


@functools.lru_cache(maxsize=8)
def _template(resolution: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Angles (θ around, φ from the pole) of a UV sphere's vertices and its triangles."""
    sphere = pv.Sphere(radius=1.0, theta_resolution=resolution, phi_resolution=resolution)
    pts = np.asarray(sphere.points, dtype=np.float64)
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)
    theta = np.arctan2(pts[:, 1], pts[:, 0])
    phi = np.arccos(np.clip(pts[:, 2], -1, 1))
    faces = np.asarray(sphere.faces).reshape(-1, 4)[:, 1:]
    return theta, phi, faces


def unit_superquadric(alpha: float, beta: float, linear: bool, resolution: int) -> pv.PolyData:
    """A unit superquadric (radii 1) with its exact normals (as :func:`widgets.glyphs.glyph_mesh`)."""
    theta, phi, faces = _template(resolution)
    ct, st, cf, sf = np.cos(theta), np.sin(theta), np.cos(phi), np.sin(phi)

    def surface(a, b):
        if linear:
            return np.stack([_spow(cf, b), -_spow(st, a) * _spow(sf, b), _spow(ct, a) * _spow(sf, b)], -1)
        return np.stack([_spow(ct, a) * _spow(sf, b), _spow(st, a) * _spow(sf, b), _spow(cf, b)], -1)

    points = surface(alpha, beta)
    normals = surface(2.0 - alpha, 2.0 - beta)
    normals /= np.maximum(np.linalg.norm(normals, axis=1, keepdims=True), 1e-30)
    cells = np.concatenate([np.full((len(faces), 1), 3), faces], axis=1)
    mesh = pv.PolyData(points.astype(np.float32), faces=cells.ravel())
    mesh.point_data["Normals"] = normals.astype(np.float32)
    mesh.point_data.active_normals_name = "Normals"
    return mesh


@functools.lru_cache(maxsize=16)
def source_meshes(shape: str, resolution: int, sharpness: float) -> tuple[pv.PolyData, ...]:
    """The source meshes of a glyph shape: one sphere, or the superquadric bins (index
    ``linear · B² + i_cl · B + i_cp``)."""
    if shape == "ellipsoid":
        return (unit_superquadric(1.0, 1.0, True, resolution),)
    centres = (np.arange(SHAPE_BINS) + 0.5) / SHAPE_BINS
    out = []
    for linear in (False, True):
        for cl in centres:
            for cp in centres:
                if linear:
                    alpha, beta = (1 - cp) ** sharpness, (1 - cl) ** sharpness
                else:
                    alpha, beta = (1 - cl) ** sharpness, (1 - cp) ** sharpness
                out.append(unit_superquadric(alpha, beta, linear, resolution))
    return tuple(out)


def quaternions(rotations: np.ndarray) -> np.ndarray:
    """(w, x, y, z) unit quaternions of rotation matrices (G, 3, 3) (VTK's order)."""
    m = rotations
    trace = m[:, 0, 0] + m[:, 1, 1] + m[:, 2, 2]
    q = np.empty((len(m), 4))
    q[:, 0] = np.sqrt(np.maximum(0.0, 1 + trace)) / 2
    q[:, 1] = np.sqrt(np.maximum(0.0, 1 + m[:, 0, 0] - m[:, 1, 1] - m[:, 2, 2])) / 2
    q[:, 2] = np.sqrt(np.maximum(0.0, 1 - m[:, 0, 0] + m[:, 1, 1] - m[:, 2, 2])) / 2
    q[:, 3] = np.sqrt(np.maximum(0.0, 1 - m[:, 0, 0] - m[:, 1, 1] + m[:, 2, 2])) / 2
    q[:, 1] = np.copysign(q[:, 1], m[:, 2, 1] - m[:, 1, 2])
    q[:, 2] = np.copysign(q[:, 2], m[:, 0, 2] - m[:, 2, 0])
    q[:, 3] = np.copysign(q[:, 3], m[:, 1, 0] - m[:, 0, 1])
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def tensor_instances(
    tensors: np.ndarray,
    centres: np.ndarray,
    *,
    shape: str = "superquadric",
    size_mm: float = 2.0,
    resolution: int = 10,
    sharpness: float = 3.0,
    colour: str = "direction",
) -> pv.PolyData:
    """The per-glyph arrays of world-frame tensors (G, 6) at world centres (G, 3): points at the
    centres, ``orientation`` (quaternions), ``scale`` (radii: ``size_mm`` × λ / max λ1),
    ``source`` (which source mesh), ``rgb`` (|e1| or FA); the source meshes' key in field data.
    :func:`instance_arrays` then :func:`instances_mesh`."""
    arrays = instance_arrays(
        tensors, centres, shape=shape, size_mm=size_mm, resolution=resolution, sharpness=sharpness, colour=colour
    )
    return instances_mesh(arrays)


def instance_arrays(
    tensors: np.ndarray,
    centres: np.ndarray,
    *,
    shape: str = "superquadric",
    size_mm: float = 2.0,
    resolution: int = 10,
    sharpness: float = 3.0,
    colour: str = "direction",
) -> dict:
    """:func:`tensor_instances`' arrays, NumPy only (a worker makes them; the VTK mesh is made on
    the GUI thread): ``points``, the point arrays by name, ``sources``."""
    parts = instance_parts(tensors, shape=shape, colour=colour)
    return joined_instances(parts, centres, shape=shape, size_mm=size_mm, resolution=resolution, sharpness=sharpness)


def instance_parts(tensors: np.ndarray, *, shape: str = "superquadric", colour: str = "direction") -> dict:
    """What each glyph of world-frame tensors (G, 6) is on its own (its size depends on the
    largest of all shown: :func:`joined_instances`): ``evals`` (G, 3) clipped at 0,
    ``orientation`` (quaternions), ``source`` (which source mesh), ``rgb``."""
    evals, evecs = tensor_eigen(np.asarray(tensors, dtype=np.float64))
    evals = np.maximum(evals, 0.0)
    total = np.maximum(evals.sum(1), 1e-30)
    cl = (evals[:, 0] - evals[:, 1]) / total
    cp = 2.0 * (evals[:, 1] - evals[:, 2]) / total
    rotation = evecs.copy()
    # a proper rotation (the glyphs are symmetric); det = e1 · (e2 × e3), a tenth of np.linalg.det's time
    det = np.einsum("gi,gi->g", rotation[:, :, 0], np.cross(rotation[:, :, 1], rotation[:, :, 2]))
    rotation[det < 0, :, 2] *= -1
    if shape == "ellipsoid":
        source = np.zeros(len(evals), dtype=np.int32)
    else:
        bin_of = lambda c: np.clip((c * SHAPE_BINS).astype(np.int32), 0, SHAPE_BINS - 1)  # noqa: E731
        source = (cl >= cp).astype(np.int32) * SHAPE_BINS**2 + bin_of(cl) * SHAPE_BINS + bin_of(cp)
    rgb = np.repeat(fractional_anisotropy(evals, evecs)[:, None], 3, 1) if colour == "fa" else np.abs(evecs[:, :, 0])
    return {
        "evals": evals,
        "orientation": quaternions(rotation).astype(np.float32),
        "source": source,
        "rgb": (rgb * 255 + 0.5).astype(np.uint8),
    }


def joined_instances(
    parts: dict, centres: np.ndarray, *, shape: str, size_mm: float, resolution: int, sharpness: float = 3.0
) -> dict:
    """The instance arrays of glyphs' :func:`instance_parts` (joined from several, or one) at
    world ``centres`` (G, 3): the radii are ``size_mm`` × λ / the largest λ1 of them all."""
    evals = parts["evals"]
    lam_max = max(float(evals[:, 0].max()), 1e-30) if len(evals) else 1.0
    point_data = {
        "orientation": parts["orientation"],
        "scale": np.maximum(evals / lam_max * size_mm, 1e-6 * size_mm).astype(np.float32),
        "source": parts["source"],
        "rgb": parts["rgb"],
    }
    sources = np.array([shape, str(resolution), repr(float(sharpness))])
    return {"points": np.asarray(centres, dtype=np.float32), "point_data": point_data, "sources": sources}


def instances_mesh(arrays: dict) -> pv.PolyData:
    """The instances' mesh of :func:`instance_arrays` (on the GUI thread: a VTK object)."""
    instances = pv.PolyData(arrays["points"])
    for name, values in arrays["point_data"].items():
        instances.point_data[name] = values
    instances.point_data.active_scalars_name = "rgb"
    instances.field_data["sources"] = arrays["sources"]
    return instances


def is_instances(mesh) -> bool:
    return mesh is not None and "sources" in mesh.field_data


def sources_of(instances: pv.PolyData) -> tuple[pv.PolyData, ...]:
    shape, resolution, sharpness = (str(v) for v in instances.field_data["sources"])
    return source_meshes(shape, int(resolution), float(sharpness))


def rgb_actor(mapper) -> vtkActor:
    """An actor of ``mapper`` coloured by its input's "rgb" point array as it is (bytes, no
    lookup table)."""
    mapper.SetScalarModeToUsePointFieldData()
    mapper.SelectColorArray("rgb")
    mapper.SetColorModeToDirectScalars()
    mapper.ScalarVisibilityOn()
    actor = vtkActor()
    actor.SetMapper(mapper)
    return actor


def glyph_actor(instances: pv.PolyData) -> vtkActor:
    """An actor drawing ``instances`` with their source meshes (OpenGL instancing)."""
    mapper = vtkGlyph3DMapper()
    mapper.SetOrientationModeToQuaternion()
    mapper.SetOrientationArray("orientation")
    mapper.SetScaleModeToScaleByVectorComponents()
    mapper.SetScaleArray("scale")
    mapper.SetScaleFactor(1.0)
    mapper.SetSourceIndexArray("source")
    mapper.SourceIndexingOn()
    actor = rgb_actor(mapper)
    actor.GetProperty().SetInterpolationToPhong()
    show_instances(actor, instances)
    return actor


def show_instances(actor: vtkActor, instances: pv.PolyData) -> None:
    """New per-glyph arrays in the actor; the source meshes are set again only when they change."""
    mapper = actor.GetMapper()
    sources = sources_of(instances)
    if getattr(actor, "_sources", None) is not sources:
        mapper.SetSourceData(sources[0])
        for index, mesh in enumerate(sources[1:], start=1):
            mapper.SetSourceData(index, mesh)
        actor._sources = sources
    mapper.SetInputData(instances)
