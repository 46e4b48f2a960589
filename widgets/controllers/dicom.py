"""DICOM in the window: File ▸ Open DICOM folder… (and a dropped DICOM folder) with a series
chooser, and File ▸ Export for navigation…, each running as a background job.

Listing, conversion (:mod:`tractlens.app.io.dicom_import`) and export
(:mod:`tractlens.app.io.dicom_export`) run on the job runner's workers; this controller only asks
(through :mod:`..dialogs`, so a scripted run never waits) and puts the results in the document.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from tractlens.app.io.dicom_series import is_dicom_folder
from tractlens.app.jobs import JobRunner
from tractlens.app.loaders import is_anatomical, load_layers
from tractlens.app.model import Document
from tractlens.app.params import DicomExportParams

from .. import dialogs


class DicomController(QObject):
    """Opens DICOM folders into ``document`` and exports its bundles for navigation."""

    loaded = Signal(object)  # the folder whose layers were added
    exported = Signal(object)  # the export's summary (ExportResult.as_dict())
    message = Signal(str, int)
    error = Signal(str, str)

    def __init__(self, document: Document, runner: JobRunner, *, device: str = "auto", parent: QObject | None = None):
        super().__init__(parent)
        self.document, self.runner, self.device = document, runner, device

    def _parent(self) -> QWidget | None:
        return self.parent() if isinstance(self.parent(), QWidget) else None

    @staticmethod
    def handles(path: str | os.PathLike) -> bool:
        return is_dicom_folder(path)

    # ------------------------------------------------------------------ open
    def open_folder_dialog(self) -> int | None:
        folder = dialogs.folder(self._parent(), "Open a DICOM folder (CD, PACS export or one series)")
        return self.open_folder(folder) if folder else None

    def open_folder(self, folder: str | os.PathLike) -> int:
        """List the folder's series on a worker, ask which diffusion series when there are several,
        then convert and load them (another job). Returns the listing job's id."""
        from tractlens.app.io.dicom_series import list_series

        folder = Path(folder)
        return self.runner.submit(
            f"list DICOM {folder.name}",
            lambda ctx: list_series(folder),
            on_done=lambda listed: self._listed(folder, listed),
            on_error=self.error.emit,
        )

    def _listed(self, folder: Path, listed) -> None:
        dwi = [s for s in listed if s.kind == "dwi"]
        choice = None
        if len(dwi) > 1:
            options = [(str(s.number if s.number is not None else s.uid), s.label) for s in dwi]
            choice = dialogs.series(
                self._parent(), "Choose the diffusion series", f"{folder.name} holds several diffusion series:", options
            )
            if choice is None:
                self.error.emit(
                    f"{folder}: not opened: it holds several diffusion series and none was chosen "
                    "(" + "; ".join(s.label for s in dwi) + ")",
                    "",
                )
                return None
        found = ", ".join(s.label for s in listed)
        self.message.emit(f"{folder.name}: {len(listed)} series ({found}); converting…", 10000)
        return self.load(folder, choice)

    def load(self, folder: Path, series: str | None = None) -> int:
        """Convert (cached) and load the folder's series: the diffusion series fitted, the images under it."""
        reference = None
        if self.document.reference_affine is not None:
            reference = (self.document.reference_affine, self.document.reference_shape)
        device = self.device

        def job(ctx):
            return load_layers(
                folder, reference=reference, device=device, progress=ctx.progress, cancelled=ctx.cancelled,
                dicom_series=series,
            )  # fmt: skip

        return self.runner.submit(f"open DICOM {folder.name}", job, on_done=lambda layers: self._add(folder, layers),
                                  on_error=self.error.emit)  # fmt: skip

    def _add(self, folder: Path, layers) -> None:
        images = [layer for layer in self.document.layers if layer.kind in ("scalar", "dwi", "rgb", "labels")]
        anatomy = [layer for layer in layers if is_anatomical(layer)]
        for layer in [*(lay for lay in layers if lay not in anatomy), *anatomy]:  # the anatomy under the maps
            self.document.add_layer(layer)
            if layer.kind in ("scalar", "dwi", "rgb", "labels") and layer not in anatomy:
                images.append(layer)
            below = [self.document.layers.index(old) for old in images if old in self.document.layers]
            if below and layer in anatomy:
                self.document.move_layer(layer, min(below))
        self.loaded.emit(folder)

    # ---------------------------------------------------------------- export
    def export_dialog(self) -> int | None:
        """Ask for the reference series and the output folder, then export the visible bundles."""
        parent = self._parent()
        reference = dialogs.folder(parent, "Reference series for navigation (its DICOM folder, e.g. the T1)")
        if not reference:
            return None
        outdir = dialogs.folder(parent, "Folder to write the DICOM objects into")
        if not outdir:
            return None
        return self.export(reference, outdir)

    def export(self, reference: str | os.PathLike, outdir: str | os.PathLike, params: DicomExportParams | None = None):
        """Export every visible tractogram layer (and the marked lesion) onto ``reference`` in a job."""
        from tractlens.app.pipelines.connectivity import default_lesion, lesion_mask_of

        params = params or DicomExportParams()
        bundles = [layer for layer in self.document.layers if layer.kind == "tractogram" and layer.visible]
        if not bundles:
            self.error.emit("Nothing to export: no visible tractogram. Track or open bundles first.", "")
            return None
        inputs = []
        for layer in bundles:
            tract = layer.data
            points_mm = tract.points @ tract.affine[:3, :3].T + tract.affine[:3, 3]
            inputs.append((layer.name, points_mm, tract.offsets.copy()))
        lesion_layer = default_lesion(self.document.layers)
        lesion = None
        if lesion_layer is not None:
            lesion = (lesion_layer.name, lesion_mask_of(lesion_layer).copy(), lesion_layer.data.affine.copy())
        frames = [layer.provenance.get("dicom", {}) for layer in self.document.layers if layer.kind == "dwi"]
        dwi_frame = next((f.get("frame_of_reference_uid") for f in frames if f.get("frame_of_reference_uid")), None)

        def job(ctx):
            from tractlens.app.io.dicom_export import (
                check_frame_of_reference,
                export_dicom,
                read_reference,
                structures_on_reference,
            )

            ctx.progress(0, 1, "reading the reference series")
            ref = read_reference(reference)
            check_frame_of_reference(ref, dwi_frame, "the diffusion series open")
            structures = structures_on_reference(ref, inputs, lesion, params.dilate_mm)
            ctx.check()
            return export_dicom(ref, structures, outdir, params, progress=ctx.progress).as_dict()

        def done(summary) -> None:
            for layer in bundles:
                layer.provenance["dicom_export"] = summary  # the report lists it with the bundle
            kinds = ", ".join(summary["files"])
            self.message.emit(f"Exported for navigation ({kinds}) to {summary['outdir']}", 15000)
            self.exported.emit(summary)

        return self.runner.submit("export for navigation", job, on_done=done, on_error=self.error.emit)
