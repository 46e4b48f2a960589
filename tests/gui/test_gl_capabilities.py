"""What the fibre layer reads of an OpenGL context, and the draw ids it gives the shader (issue 41),
with a stand-in for PyOpenGL's ``GL`` module: the answers a driver may give, read robustly."""

import numpy as np
import pytest

from tractlens.app.fiber_arrays import level_cells, piece_bounds
from tractlens.widgets.gl_fiber_actors import drawn_ids
from tractlens.widgets.gl_fibers import restart_indices, strips
from tractlens.widgets.gl_fibre_program import read_capabilities


class FakeGL:
    """The few GL queries :func:`read_capabilities` makes, answering as told."""

    GL_VENDOR, GL_RENDERER, GL_VERSION, GL_SHADING_LANGUAGE_VERSION = 1, 2, 3, 4
    GL_MAJOR_VERSION, GL_MINOR_VERSION, GL_CONTEXT_PROFILE_MASK = 10, 11, 12
    GL_MAX_TEXTURE_BUFFER_SIZE, GL_NUM_EXTENSIONS, GL_EXTENSIONS = 13, 14, 15

    def __init__(self, version=b"4.6.0 NVIDIA 580.82.07", integers=None, extensions=()):
        self.strings = {1: b"NVIDIA Corporation", 2: b"NVIDIA H100 80GB HBM3/PCIe/SSE2", 3: version, 4: b"4.60 NVIDIA"}
        self.integers = {10: np.int32(4), 11: np.int32(6), 12: np.int32(1), 13: np.int32(134217728)}
        self.integers.update(integers or {})
        self.extensions = list(extensions)
        self.integers[14] = len(self.extensions)

    def glGetString(self, name):
        return self.strings[name]

    def glGetIntegerv(self, name):
        value = self.integers[name]
        if isinstance(value, Exception):
            raise value
        return value

    def glGetStringi(self, _name, index):
        return self.extensions[index].encode()


def test_a_texture_buffer_limit_of_2_to_the_31_is_read_as_unsigned():
    """A GLint answer of -2^31 (a limit of 2^31 texels) is a large limit, not none."""
    caps = read_capabilities(FakeGL(integers={13: np.int32(-(2**31))}))
    assert caps.max_texture_buffer_texels == 2**31
    assert caps.version == (4, 6) and caps.profile == "core" and caps.rgb32f_texture_buffers


@pytest.mark.parametrize(
    "major, minor",
    [(np.array([4], np.int32), np.array([6], np.int32)), (4, 6), (ValueError("GL_INVALID_ENUM"), 0)],
)
def test_the_version_is_read_from_the_integers_or_else_the_string(major, minor):
    caps = read_capabilities(FakeGL(integers={10: major, 11: minor}))
    assert caps.version == (4, 6)
    assert caps.queried_version == (None if isinstance(major, Exception) else (4, 6))
    assert ("GL_MAJOR_VERSION" in " ".join(caps.errors)) == isinstance(major, Exception)


def test_an_old_context_has_no_rgb32f_texture_buffers_unless_the_extension_says_so():
    old = read_capabilities(FakeGL(version=b"3.3.0 NVIDIA", integers={10: 3, 11: 3}))
    assert old.version == (3, 3) and not old.rgb32f_texture_buffers and not old.draw_ids
    extended = read_capabilities(
        FakeGL(
            version=b"3.3.0",
            integers={10: 3, 11: 3},
            extensions=["GL_ARB_texture_buffer_object_rgb32", "GL_ARB_shader_draw_parameters"],
        )
    )
    assert extended.rgb32f_texture_buffers and extended.draw_ids


def test_the_drawn_ids_follow_a_selection_over_pieces():
    """Each piece's streamline (from its first) of each draw: None where draw k is streamline k."""
    lengths = np.random.default_rng(0).integers(2, 30, 400)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    bounds = piece_bounds(offsets, max_points=1500)
    assert len(bounds) > 3
    everything = level_cells(offsets, "full", bounds=bounds, ranges_only=True)
    assert drawn_ids(everything, offsets, bounds) == [None] * len(bounds)
    selected = np.zeros(400, dtype=bool)
    selected[::7] = True
    cells = level_cells(offsets, "full", selected, bounds=bounds, ranges_only=True)
    ranges = cells.ranges(offsets, bounds)
    for (a, _b), ids, (first, count) in zip(bounds, drawn_ids(cells, offsets, bounds), ranges, strict=True):
        chosen = a + ids  # the tractogram's streamline of each draw
        np.testing.assert_array_equal(first, offsets[chosen] - offsets[a])
        np.testing.assert_array_equal(count, lengths[chosen])


def test_the_decimated_level_is_one_draw_per_streamline_in_its_element_buffer():
    lengths = np.random.default_rng(1).integers(5, 60, 6000)  # ~190 k points: every k-th kept
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    cells = level_cells(offsets, "moving_software")
    assert cells.decimated
    elements = restart_indices(cells)
    counts, starts = strips(cells)
    for k in range(cells.n_streamlines):
        first = int(starts[k]) // 4
        np.testing.assert_array_equal(
            elements[first : first + counts[k]], cells.connectivity[cells.offsets[k] : cells.offsets[k + 1]]
        )
        assert elements[first + counts[k]] == 0xFFFFFFFF  # the restart marker after it
