"""Tensor glyphs as GPU instances (issue 41): the per-glyph arrays drawn as instances of source
meshes show what one mesh of every glyph's vertices showed, and a slice step changes only them."""

import numpy as np
import pytest
import pyvista as pv
from PIL import Image

from tests.conftest import ARTIFACTS
from tractlens.app.display_data import tensor_eigen
from tractlens.widgets.glyph_instances import glyph_actor, quaternions, show_instances, tensor_instances
from tractlens.widgets.glyphs import glyph_mesh


def some_tensors(rng, n=12):
    """Linear, planar and round tensors in random orientations (world frame, xx xy xz yy yz zz)."""
    evals = np.array([[1.7, 0.3, 0.3], [1.2, 1.0, 0.2], [0.9, 0.8, 0.7], [1.5, 0.6, 0.2]]) * 1e-3
    out = []
    for k in range(n):
        q, _ = np.linalg.qr(rng.normal(size=(3, 3)))
        m = q @ np.diag(evals[k % len(evals)]) @ q.T
        out.append([m[0, 0], m[0, 1], m[0, 2], m[1, 1], m[1, 2], m[2, 2]])
    centres = np.stack(np.meshgrid(np.arange(4), np.arange(3), [0], indexing="ij"), -1).reshape(-1, 3) * 5.0
    return np.array(out), centres[:n].astype(float)


def render(prop_or_mesh, size=(400, 300)):
    plotter = pv.Plotter(off_screen=True, window_size=size)
    plotter.set_background("black")
    if isinstance(prop_or_mesh, pv.PolyData):
        plotter.add_mesh(prop_or_mesh, scalars="rgb", rgb=True, show_scalar_bar=False)
    else:
        plotter.add_actor(prop_or_mesh)
    plotter.camera_position = [(7.5, 5.0, 40.0), (7.5, 5.0, 0.0), (0, 1, 0)]
    image = plotter.screenshot(return_img=True)
    plotter.close()
    return image


def test_quaternions_rotate_as_the_matrices(rng):
    rotations = np.stack([np.linalg.qr(rng.normal(size=(3, 3)))[0] for _ in range(50)])
    rotations[np.linalg.det(rotations) < 0, :, 2] *= -1
    w, x, y, z = quaternions(rotations).T
    rebuilt = np.stack(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    ).transpose(2, 0, 1)
    np.testing.assert_allclose(rebuilt, rotations, atol=1e-9)


@pytest.mark.parametrize("shape", ["ellipsoid", "superquadric"])
def test_instanced_glyphs_draw_what_the_glyph_mesh_drew(rng, shape):
    tensors, centres = some_tensors(rng)
    mesh = glyph_mesh(tensors, centres, shape=shape, size_mm=2.0, resolution=10)
    instances = tensor_instances(tensors, centres, shape=shape, size_mm=2.0, resolution=10)
    assert instances.n_points == len(tensors)  # one point per glyph: the per-instance arrays only
    evals, _ = tensor_eigen(tensors)
    np.testing.assert_allclose(instances.point_data["scale"][:, 0], evals[:, 0] / evals[:, 0].max() * 2.0, rtol=1e-6)
    old, new = render(mesh), render(glyph_actor(instances))
    ARTIFACTS.mkdir(exist_ok=True)
    Image.fromarray(np.concatenate([old, new], axis=1)).save(ARTIFACTS / f"glyph_instances_{shape}.png")
    lit_old, lit_new = old.max(-1) > 20, new.max(-1) > 20
    overlap = (lit_old & lit_new).sum() / max((lit_old | lit_new).sum(), 1)
    # The same silhouettes (superquadrics take the source of their (cl, cp) bin: nearly the same).
    assert overlap > (0.97 if shape == "ellipsoid" else 0.85), overlap
    both = lit_old & lit_new
    assert np.abs(old[both].astype(int) - new[both].astype(int)).mean() < 25  # alike shading and colour


def test_a_slice_step_changes_only_the_per_glyph_arrays(rng):
    tensors, centres = some_tensors(rng)
    actor = glyph_actor(tensor_instances(tensors, centres))
    mapper = actor.GetMapper()
    sources = [mapper.GetSource(k) for k in range(mapper.GetNumberOfInputConnections(1))]
    moved = tensor_instances(tensors[::-1], centres + np.array([0.0, 0.0, 1.25]))
    show_instances(actor, moved)
    assert mapper.GetInput() is moved  # the new per-glyph arrays
    assert [mapper.GetSource(k) for k in range(len(sources))] == sources  # the same source meshes
