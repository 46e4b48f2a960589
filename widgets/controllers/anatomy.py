"""Anatomy in the window: Image ▸ Register to DWI…, Apply a registration… and Register DWI to
MNI…, File ▸ Open registration…, ROI ▸ Add atlas region…, New ROI on the selected image and Save
ROI in its image's scanner space…, the MNI coordinate of the cursor in the status bar, and the
alignment controls under the layer form.

The work is :mod:`app.anatomy`'s (registration, atlas regions) and :mod:`app.anatomy_layers`'
(an image placed through a registration, an atlas region as an ROI, the MNI coordinate); it runs
on the window's job runner (``runner.submit`` with ``on_done``/``on_error``: progress and Cancel
in the Jobs panel) and the results go into the document (``document.registrations``, the layer
stack). This module is about widgets: it holds the window's menus and labels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QFormLayout, QLabel, QWidget

from tractlens.app.anatomy_layers import (
    REGISTRATION_KEY,
    as_scanned,
    atlas_region_layer,
    mask_as_scanned,
    mni_coordinate,
    new_roi_on,
    placed_by,
    placed_layer,
    roi_following,
    roi_in_scanner_space,
    same_field_of_view,
    template_registration,
)
from tractlens.app.grid import Grid
from tractlens.app.layers import ALIGNMENT_MODES
from tractlens.app.model import Layer

from .. import dialogs
from ..anatomy_dialogs import AtlasRegionDialog, RegisterDialog
from .menus import add_action

IMAGE_KINDS = ("scalar", "labels", "dwi")


class AnatomyController:
    """The anatomy actions of ``window`` (a :class:`~tractlens.widgets.main_window.MainWindow`)."""

    def __init__(self, window):
        self.window = window
        self.document = window.document
        self.runner = window.runner
        self.register_dialog: RegisterDialog | None = None
        self.atlas_dialog: AtlasRegionDialog | None = None
        self._issued = 0  # the last registration id handed out ("R3": 3)
        self.mni_label = QLabel()
        self.mni_label.setObjectName("mni")
        self.alignment = AlignmentControls(window)
        self.document.connect(self._on_document)

    # ------------------------------------------------------------------ menus
    def build(self) -> None:
        window = self.window
        bar = window.menuBar()
        # the window's own menus, not looked up among the bar's actions by text: a wrapper Shiboken
        # finds by a C++ address can be a stale one of a destroyed object (a CI run got a QSurface)
        track = window.track_menu.menuAction()
        image_menu = bar.addMenu("I&mage")
        roi_menu = bar.addMenu("&ROI")
        bar.insertMenu(track, image_menu)  # after View and Edit, before the methods
        bar.insertMenu(track, roi_menu)
        add_action(window, image_menu, "&Register to DWI…", self.register_to_dwi_dialog)
        add_action(window, image_menu, "&Apply a registration to the selected image…", self.apply_registration_dialog)
        add_action(window, image_menu, "Register DWI to &MNI…", self.register_to_mni_dialog)
        add_action(window, roi_menu, "Add &atlas region…", self.atlas_region_dialog)
        add_action(window, roi_menu, "New ROI on the &selected image", self.new_roi_on_selected)
        add_action(window, roi_menu, "Sa&ve ROI in its image's scanner space…", self.save_roi_in_scanner_space_dialog)
        file_menu = window.file_menu
        recent = window.recent_menu.menuAction()  # "Open recent"
        opener = add_action(window, file_menu, "Open re&gistration…", self.open_registration_dialog)
        file_menu.insertAction(recent, opener)
        window.statusBar().addPermanentWidget(self.mni_label)  # stays while messages show
        window.layer_panel.layout().addWidget(self.alignment)

    # ----------------------------------------------------------- registering
    def _reference(self) -> Grid | None:
        doc = self.document
        return None if doc.reference_affine is None else Grid(doc.reference_affine, doc.reference_shape)

    def _on_reference(self, layer: Layer) -> bool:
        reference = self._reference()
        return reference is not None and Grid.of(layer.data).matches(reference)

    def fixed_candidates(self) -> list[Layer]:
        """The images a registration to the DWI may be onto: those on the reference grid, the
        diffusion series (its mean b=0) first."""
        layers = [layer for layer in self.document.layers if layer.kind in IMAGE_KINDS and self._on_reference(layer)]
        return sorted(layers, key=lambda layer: layer.kind != "dwi")

    def moving_candidates(self) -> list[Layer]:
        """The images that can be registered onto the DWI: scalar and label images off its grid
        (a T1, a FLAIR, an fMRI map), then those on it."""
        layers = [layer for layer in self.document.layers if layer.kind in ("scalar", "labels")]
        return sorted(layers, key=self._on_reference)

    def register_to_dwi_dialog(self) -> RegisterDialog | None:
        """Image ▸ Register to DWI…: the dialog (non-blocking); Register starts the job."""
        return self._open_register_dialog(self.moving_candidates(), self.fixed_candidates(), "Register to DWI")

    def register_to_mni_dialog(self) -> RegisterDialog | None:
        """Image ▸ Register DWI to MNI…: a template registration of an image on the DWI grid."""
        return self._open_register_dialog(self.fixed_candidates(), None, "Register DWI to MNI")

    def _open_register_dialog(self, moving, fixed, title) -> RegisterDialog | None:
        from tractlens.app.params import RegisterParams

        if self.document.reference_affine is None or not moving or (fixed is not None and not fixed):
            self.window.report_error("Open the diffusion data and the image to register first (File ▸ Open…)", "")
            return None
        if self.register_dialog is not None:
            self.register_dialog.deleteLater()
        masks = [layer for layer in self.document.layers if layer.kind in ("roi", "labels", "scalar")]
        dialog = RegisterDialog(moving, fixed, RegisterParams, self.window, title=title, masks=masks)
        selected = self.window.layer_panel.selected_layer()
        if selected is not None:
            dialog.choose(selected)
        dialog.accepted.connect(
            lambda: self.register(
                dialog.moving_layer,
                dialog.fixed_layer,
                dialog.params,
                moving_mask=dialog.moving_mask,
                fixed_mask=dialog.fixed_mask,
            )
        )
        self.register_dialog = dialog
        _show(dialog)
        return dialog

    def _new_id(self) -> str:
        """A registration id no registration of the document (nor a job still running) has."""
        numbers = [int(key[1:]) for key in self.document.registrations if key[1:].isdigit()]
        self._issued = max(max(numbers, default=0), self._issued) + 1
        return f"R{self._issued}"

    def register(self, moving: Layer, fixed: Layer | None, params, *, moving_mask=None, fixed_mask=None) -> int:
        """Register ``moving`` onto ``fixed`` (None: the MNI template) on a worker
        (:func:`app.anatomy.register_images`), with brain masks (None, a layer or a file path);
        when done the registration joins the document and, onto the DWI, ``moving`` is shown
        registered (:func:`app.anatomy_layers.placed_layer`) in its place. A cancelled or failed
        registration changes nothing. The job id."""
        from tractlens.app.anatomy import register_images

        volume = as_scanned(moving)  # re-registering starts from the scan
        masks = {
            key: mask_as_scanned(mask) if isinstance(mask, Layer) else mask
            for key, mask in (("moving_mask", moving_mask), ("fixed_mask", fixed_mask))
        }
        target = "mni" if fixed is None else fixed.data
        reference, registration_id = self._reference(), self._new_id()
        original, device = moving, self.window.device  # the window's compute device (--device)

        def job(ctx):
            ctx.progress(0, 1, f"registering {volume.name}")
            result = register_images(
                volume, target, params=params, progress=ctx.progress, cancelled=ctx.cancelled, device=device, **masks
            )
            ctx.check()
            placed = None
            if fixed is not None:
                ctx.progress(1, 1, f"placing {volume.name} on the DWI grid")
                placed = placed_layer(original, result.registration, registration_id, reference, volume)
            return result, placed

        def done(outcome) -> None:
            result, placed = outcome
            self.add_registration(result.registration, registration_id)
            if placed is not None and original in self.document.layers:
                placed.data.unplaced = volume
                self._replace(original, placed, result.registration)
            used = [mask["name"] for mask in result.summary.get("masks", {}).values() if mask]
            within = f", within the brain masks {' and '.join(used)}" if used else ""
            self.window.statusBar().showMessage(f"Registered: {result.registration.describe()}{within}", 15000)

        name = f"register {volume.name} → {'MNI' if fixed is None else fixed.name}"
        return self.runner.submit(name, job, on_done=done, on_error=self.window.report_error)

    def _replace(self, old: Layer, placed: Layer, registration) -> None:
        """Put the placed image in its layer's place, with the ROIs drawn on it moved along
        (:func:`app.anatomy_layers.roi_following`), and select it."""
        reference = self._reference()
        for roi in list(self.document.layers):
            moved = roi_following(roi, old, placed, registration, reference)
            if moved is not None:
                self.document.replace_layer(roi, moved)
        self.document.replace_layer(old, placed)
        self.window.select_layer(placed)

    def add_registration(self, registration, registration_id: str | None = None) -> str:
        """Keep ``registration`` in the document (sessions save it); its id."""
        registration_id = registration_id or self._new_id()
        self.document.registrations[registration_id] = registration
        self.update_mni_label()
        return registration_id

    def open_registration_dialog(self) -> None:
        folder = dialogs.folder(self.window, "Open a registration folder (tractlens register)")
        if folder:
            self.open_registration(folder)

    def open_registration(self, folder) -> int:
        """File ▸ Open registration…: read a ``tractlens register`` folder on a worker. A template
        (MNI) registration gives the MNI coordinate and atlas regions; one whose moving image
        is open beside the DWI it registers to places that image. The job id."""
        from tractlens.app.io.transforms import load_registration

        folder = Path(folder)
        reference, registration_id = self._reference(), self._new_id()
        unplaced = [
            layer
            for layer in self.document.layers
            if layer.kind in ("scalar", "labels") and REGISTRATION_KEY not in layer.provenance
        ]

        def job(ctx):
            ctx.progress(0, 1, f"reading {folder.name}")
            registration = load_registration(folder)
            layer = moved_by(registration, reference, unplaced)
            placed = None if layer is None else placed_layer(layer, registration, registration_id, reference)
            return registration, registration_id, layer, placed

        def done(outcome) -> None:
            registration, registration_id, layer, placed = outcome
            self.add_registration(registration, registration_id)
            text = f"Registration opened: {registration.describe()}"
            if placed is not None and layer in self.document.layers:
                placed.data.unplaced = layer.data
                self._replace(layer, placed, registration)
                text += f"; {layer.name} is shown registered"
            self.window.statusBar().showMessage(text, 15000)

        return self.runner.submit(
            f"open registration {folder.name}", job, on_done=done, on_error=self.window.report_error
        )

    def apply_registration_dialog(self) -> int | None:
        """Image ▸ Apply a registration to the selected image…: place another image of a registered
        image's space (an fMRI map or a FLAIR in the T1's space) with that registration; the job id."""
        layer = self.window.layer_panel.selected_layer()
        reference = self._reference()
        choices = [
            (key, f"{key}: {registration.describe()}")
            for key, registration in self.document.registrations.items()
            if not registration.template and reference is not None and same_field_of_view(registration.fixed, reference)
        ]
        if layer is None or layer.kind not in ("scalar", "labels") or not choices:
            self.window.report_error(
                "Select the image to place (an fMRI map, a FLAIR in the T1's space) after registering an image of "
                "its series (Image ▸ Register to DWI…, or File ▸ Open registration…)",
                "",
            )
            return None
        text = f"Place {layer.name} with which registration? (Its image and {layer.name} must share their space.)"
        key = dialogs.choice(self.window, "Apply a registration", text, [*choices, ("", "Cancel")], default="")
        return self.apply_registration(layer, key) if key else None

    def apply_registration(self, layer: Layer, registration_id: str) -> int:
        """Show ``layer`` placed by the document's registration ``registration_id`` (on a worker)."""
        registration = self.document.registrations[registration_id]
        reference = self._reference()
        volume = as_scanned(layer)

        def done(placed: Layer) -> None:
            if layer in self.document.layers:
                placed.data.unplaced = volume
                self._replace(layer, placed, registration)
                self.window.statusBar().showMessage(f"{layer.name} placed by {registration.describe()}", 15000)

        return self.runner.submit(
            f"place {layer.name}",
            lambda ctx: placed_layer(layer, registration, registration_id, reference, volume),
            on_done=done,
            on_error=self.window.report_error,
        )

    # ------------------------------------------------------------------ ROIs
    def atlas_region_dialog(self) -> AtlasRegionDialog | None:
        """ROI ▸ Add atlas region…: needs a template registration (Register DWI to MNI, or a
        ``tractlens register … mni`` folder opened)."""
        from tractlens.app.atlases import atlas_info, atlas_names, find_regions

        if self.template() is None:
            other = template_registration(self.document.registrations.values())
            why = (
                ""
                if other is None
                else f" of the DWI, or of an image registered to the DWI ({other.describe()} was made from an "
                "image that no registration joins to the DWI: register that image to the DWI too, Image ▸ "
                "Register to DWI…, and the two are chained)"
            )
            self.window.report_error(
                f"Atlas regions need a registration to the MNI template{why}: Image ▸ Register DWI to MNI…, or "
                "File ▸ Open registration… with a folder made by 'tractlens register DWI mni'",
                "",
            )
            return None
        names = atlas_names()
        titles = {name: atlas_info(name).title for name in names}
        if self.atlas_dialog is not None:
            self.atlas_dialog.deleteLater()
        dialog = AtlasRegionDialog(names, find_regions, titles, self.window)
        dialog.accepted.connect(lambda: self.add_atlas_region(dialog.atlas, dialog.value, dialog.region))
        self.atlas_dialog = dialog
        _show(dialog)
        return dialog

    def add_atlas_region(self, atlas: str, value: int, region: str) -> int:
        """Bring atlas region ``value`` to the DWI grid on a worker and add it as an ROI (undoable)."""
        registration = self.template()
        reference, layers = self._reference(), list(self.document.layers)

        def done(layer: Layer) -> None:
            self.document.add_layer(layer, undoable=True)
            self.window.select_layer(layer)
            count = int(layer.data.mask.sum())
            self.window.statusBar().showMessage(f"Atlas region {region}: {count} voxels on the DWI grid", 10000)

        return self.runner.submit(
            f"atlas region {region}",
            lambda ctx: atlas_region_layer(atlas, registration, reference, value, region, layers),
            on_done=done,
            on_error=self.window.report_error,
        )

    def new_roi_on_selected(self) -> Layer | None:
        """ROI ▸ New ROI on the selected image: an empty ROI (the tool bar's role) on the selected
        image's own grid, e.g. a lesion drawn on the registered FLAIR at its resolution; methods
        bring it onto their grid (nearest neighbour)."""
        layer = self.window.layer_panel.selected_layer()
        if layer is None or layer.kind not in IMAGE_KINDS:
            self.window.report_error("Select the image to draw on (a T1, a FLAIR) in the layer list first", "")
            return None
        tools = self.window.roi_tools
        name = tools.unique_name(f"{tools.role} on {layer.name}")
        roi = self.document.add_layer(new_roi_on(layer, name, tools.role, self.document.layers), undoable=True)
        self.window.select_layer(roi)
        if tools.tool == "navigate":
            self.window.set_tool("brush")
        return roi

    def save_roi_in_scanner_space_dialog(self) -> None:
        roi = self.window.roi_tools.active_roi()
        name = "ROI" if roi is None else roi.name
        path = dialogs.save_file(
            self.window, "Save ROI in its image's space", f"{name}.nii.gz", "NIfTI (*.nii.gz *.nii)"
        )
        if path and roi is not None:
            self.save_roi_in_scanner_space(roi, path)

    def save_roi_in_scanner_space(self, roi: Layer, path) -> Path | None:
        """ROI ▸ Save ROI in its image's scanner space…: an ROI drawn on a registered T1 written
        with the T1's own affine (:func:`app.anatomy_layers.roi_in_scanner_space`), e.g. for the
        planning software that holds the T1; the path written, or None (the user is told why)."""
        from tractlens.app.errors import InputError
        from tractlens.app.io import save_volume

        try:
            mask, affine = roi_in_scanner_space(roi)
            written = save_volume(mask.astype(np.uint8), affine, path)
        except InputError as exc:
            self.window.report_error(str(exc), "")
            return None
        self.window.statusBar().showMessage(f"ROI {roi.name} saved in its image's scanner space to {written}", 10000)
        return written

    # ---------------------------------------------------------------- status
    def _on_document(self, _source, event, **info) -> None:
        if event in ("cursor", "layers"):
            self.update_mni_label()
        if event in ("layers", "display"):
            self.alignment.show_layer()

    def mni_text(self) -> str:
        """``MNI (x, y, z) mm`` of the cursor, or "" without a template registration."""
        doc = self.document
        registration = self.template()
        if registration is None:
            return ""
        x, y, z = mni_coordinate(registration, doc.cursor_world())
        return f"MNI ({x:.1f}, {y:.1f}, {z:.1f}) mm"

    def template(self):
        """The newest template (MNI) registration of the DWI's space, or of an image registered to
        the DWI chained with that registration (:func:`app.anatomy_layers.template_registration`), or None."""
        reference = self._reference()
        if reference is None:
            return None
        return template_registration(self.document.registrations.values(), reference)

    def update_mni_label(self) -> None:
        self.mni_label.setText(self.mni_text())


class AlignmentControls(QWidget):
    """Under the layer form: how the selected image is drawn over the layers under it to judge
    a registration (as itself, blended, a checkerboard of squares so many mm wide, its edges),
    and which registration placed it."""

    def __init__(self, window):
        super().__init__()
        self.window = window
        self._updating = False
        self.mode = QComboBox()
        self.mode.setObjectName("alignment_mode")
        self.mode.addItems(ALIGNMENT_MODES)
        self.mode.setToolTip("Judge the alignment with the layers under it: a blend, a checkerboard, or its edges")
        self.size = QDoubleSpinBox()
        self.size.setObjectName("checker_mm")
        self.size.setRange(1.0, 100.0)
        self.size.setSuffix(" mm")
        self.size.setToolTip("The checkerboard's square size")
        self.placed = QLabel()
        self.placed.setObjectName("placed_by")
        self.placed.setWordWrap(True)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Alignment", self.mode)
        form.addRow("Squares", self.size)
        form.addRow("Placed by", self.placed)
        self.mode.currentTextChanged.connect(lambda mode: self._edit(alignment=mode))
        self.size.valueChanged.connect(lambda mm: self._edit(checker_mm=float(mm)))
        window.layer_panel.list.currentRowChanged.connect(lambda _row: self.show_layer())
        self.show_layer()

    def _layer(self) -> Layer | None:
        return self.window.layer_panel.selected_layer()

    def show_layer(self) -> None:
        layer = self._layer()
        image = layer is not None and layer.kind in ("scalar", "dwi", "rgb")
        self._updating = True
        self.mode.setEnabled(image)
        self.size.setEnabled(image and layer.alignment == "checkerboard")
        if layer is not None:
            self.mode.setCurrentText(layer.alignment)
            self.size.setValue(layer.checker_mm)
        placed = placed_by(layer) if layer is not None else None
        self.placed.setText(
            placed or ("scanner coordinates" if layer is not None and layer.kind != "tractogram" else "")
        )
        self._updating = False

    def _edit(self, **changes) -> None:
        layer = self._layer()
        if layer is not None and not self._updating and layer.kind in ("scalar", "dwi", "rgb"):
            layer.set(**changes)


def moved_by(registration, reference: Grid | None, layers: list[Layer]) -> Layer | None:
    """The image of ``layers`` that ``registration`` moves into the DWI's space (its moving grid,
    its fixed side over the DWI grid's field of view), or None."""
    if registration.template or reference is None or not same_field_of_view(registration.fixed, reference):
        return None
    for layer in layers:
        grid = Grid.of(layer.data)
        if grid.shape == registration.moving.shape and grid.same_placement(registration.moving):
            return layer
    return None


def _show(dialog) -> None:
    """Window-modal for a person; in a scripted run shown without modality, so that nothing waits
    on it (the script drives it, or leaves it)."""
    if dialogs.interactive():
        dialog.open()
    else:
        dialog.setModal(False)
        dialog.show()
