"""The Geodesic panel's step box in mm, as the Deterministic and Probabilistic panels' steps and
the command line's ``track geodesic --step``. The engine takes the step in voxels of the smallest
voxel size (:attr:`GeodesicParams.step`, its one definition); the box's range and default are
that field's, converted by :mod:`app.pipelines.track_geodesic` for the tensors tracked on. The
default follows the tensors until the user edits the step."""

from __future__ import annotations

from PySide6.QtWidgets import QDoubleSpinBox

from tractlens.app.pipelines.track_geodesic import geodesic_params_mm, step_mm_range

#: The grid the box's range and default are shown for before any tensors are open.
NO_TENSORS_VOXEL_MM = (1.0, 1.0, 1.0)


class StepInMm:
    """Turns a :class:`ParamsForm`'s ``step`` editor (voxels) into a step in mm."""

    def __init__(self, form, tensor_layer):
        self.form = form
        self.tensor_layer = tensor_layer  # the panel's: the tensor layer Track follows, or None
        self.box: QDoubleSpinBox = form.editors["step"]
        self.box.setSuffix(" mm")
        self.box.setDecimals(3)
        self.box.setSingleStep(0.05)
        self.box.setToolTip(
            "Step length in mm (the engine takes it in voxels of the smallest voxel size; "
            "the default is a tenth of a voxel, as on the command line)"
        )
        self.edited = False
        self.box.valueChanged.connect(self._edited)
        self.follow_tensors()

    def voxel_size(self):
        tensor = self.tensor_layer()
        return NO_TENSORS_VOXEL_MM if tensor is None else tensor.data.voxel_size

    def follow_tensors(self) -> None:
        """The range (and, until edited, the default) for the tensors tracked on now."""
        lo, hi, default = step_mm_range(self.voxel_size())
        self.box.blockSignals(True)
        self.box.setRange(lo, hi)
        if not self.edited:
            self.box.setValue(default)
        self.box.blockSignals(False)

    def _edited(self, _value) -> None:
        self.edited = True

    def params(self):
        """The form's parameters, the step converted to voxels (raises ValueError as they do)."""
        return geodesic_params_mm(self.form.values(), self.voxel_size())
