"""The document the user works on: volumes, ROI masks and tractograms, as layers.

Plain Python with change events (napari's model/view split): views subscribe
with :meth:`Observable.connect` and are called on every change; nothing polls
and nothing here knows about Qt or VTK. Arrays live in voxel index space
(voxel centres at integer indices); each object carries the affine that maps
voxel indices to RAS+ millimetres.

This module is the one place to import the model from; its parts live in
:mod:`.observable` (change events), :mod:`.volumes` (volumes, ROI masks and
shapes), :mod:`.tractogram` (streamlines), :mod:`.layers` (display properties)
and :mod:`.document` (the layer stack, cursor and undoable ROI edits).
"""

from __future__ import annotations

from .document import Document
from .layers import (
    COLORMAPS,
    GLYPH_KINDS,
    GLYPH_SHAPES,
    LAYER_KINDS,
    RANGE_SAMPLE,
    ROLE_COLOURS,
    SCALAR_KINDS,
    STICK_COLOURS,
    Layer,
    hex_colour,
)
from .observable import Observable
from .tractogram import Tractogram
from .volumes import ROI_ROLES, DWIVolume, DyadsVolume, RoiMask, Volume, normal_shape, shape_half_sizes

__all__ = [
    "COLORMAPS",
    "GLYPH_KINDS",
    "GLYPH_SHAPES",
    "LAYER_KINDS",
    "RANGE_SAMPLE",
    "ROI_ROLES",
    "ROLE_COLOURS",
    "SCALAR_KINDS",
    "STICK_COLOURS",
    "DWIVolume",
    "Document",
    "DyadsVolume",
    "Layer",
    "Observable",
    "RoiMask",
    "Tractogram",
    "Volume",
    "hex_colour",
    "normal_shape",
    "shape_half_sizes",
]
