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
    def default_reference(self) -> tuple[str, str | None, str]:
        """(folder, series UID, how the series is named) of the anatomy opened from DICOM, the
        reference a navigation export goes onto unless the user picks another; empty without one."""
        for layer in self.document.layers:
            dicom = layer.provenance.get("dicom") if isinstance(layer.provenance, dict) else None
            if (
                isinstance(dicom, dict)
                and layer.kind != "dwi"
                and is_anatomical(layer)
                and layer.provenance.get("file")
            ):
                return str(layer.provenance["file"]), dicom.get("series_instance_uid"), dicom.get("series", "")
        return "", None, ""

    def export_dialog(self) -> int | None:
        """Ask what to export, onto which reference series and where (:func:`dialogs.navigation_export`,
        scripted in a run nobody watches), then export in a job."""
        from tractlens.app.pipelines.connectivity import default_lesion, is_marked_lesion

        tracts = [layer for layer in self.document.layers if layer.kind == "tractogram"]
        if not tracts:
            self.error.emit("Nothing to export: no tractogram. Track or open bundles first.", "")
            return None
        marked = default_lesion(self.document.layers)
        reference, series, label = self.default_reference()
        try:
            choice = dialogs.navigation_export(
                self._parent(),
                bundles=[(layer.name, layer.visible) for layer in tracts],
                lesions=[layer.name for layer in self.document.layers if is_marked_lesion(layer)],
                lesion=marked.name if marked is not None else None,
                reference=reference,
                reference_series=series,
                reference_label=f"series {label}" if label else "",
            )
        except ValueError as exc:  # a scripted answer that cannot be exported
            self.error.emit(f"Export for navigation: {exc}", "")
            return None
        if choice is None:
            return None
        return self.export(choice["reference"], choice["outdir"], choice["params"],
                           reference_series=choice["reference_series"], bundles=choice["bundles"],
                           lesion=choice["lesion"])  # fmt: skip

    def export(
        self,
        reference: str | os.PathLike,
        outdir: str | os.PathLike,
        params: DicomExportParams | None = None,
        *,
        reference_series: str | None = None,
        bundles: list[str] | None = None,
        lesion: str | bool | None = True,
    ) -> int | None:
        """Export tractogram layers (``bundles`` by name; default: the visible ones) and the lesion
        (a layer's name, None for none, True for the one marked) onto ``reference`` in a job."""
        from tractlens.app.pipelines.connectivity import default_lesion, lesion_mask_of

        params = params or DicomExportParams()
        tracts = [layer for layer in self.document.layers if layer.kind == "tractogram"]
        chosen = [layer for layer in tracts if (layer.name in bundles if bundles is not None else layer.visible)]
        if not chosen:
            self.error.emit("Nothing to export: no visible tractogram. Track or open bundles first.", "")
            return None
        inputs = []
        for layer in chosen:
            tract = layer.data
            points_mm = tract.points @ tract.affine[:3, :3].T + tract.affine[:3, 3]
            fa = tract.point_scalars.get("fa")
            inputs.append((layer.name, points_mm, tract.offsets.copy(), None if fa is None else fa.copy()))
        if lesion is True:
            lesion_layer = default_lesion(self.document.layers)
        else:
            lesion_layer = next((layer for layer in self.document.layers if lesion and layer.name == lesion), None)
        lesion_input = None
        if lesion_layer is not None:
            lesion_input = (lesion_layer.name, lesion_mask_of(lesion_layer).copy(), lesion_layer.data.affine.copy())
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
            ref = read_reference(reference, reference_series)
            check_frame_of_reference(ref, dwi_frame, "the diffusion series open")
            ctx.progress(0, 1, "bundles onto the reference grid")
            structures = structures_on_reference(ref, inputs, lesion_input, params.dilate_mm)
            ctx.check()
            return export_dicom(ref, structures, outdir, params, progress=ctx.progress).as_dict()

        def done(summary) -> None:
            for layer in chosen:
                layer.provenance["dicom_export"] = summary  # the report lists it with the bundle
            kinds = ", ".join(summary["files"])
            self.message.emit(f"Exported for navigation ({kinds}) to {summary['outdir']}", 15000)
            self.exported.emit(summary)

        return self.runner.submit("export for navigation", job, on_done=done, on_error=self.error.emit)
