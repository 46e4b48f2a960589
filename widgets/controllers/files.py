"""Opening files in the window: images, tractograms, folders and the demo, each loaded on a worker
and stacked in the order asked; an image shown as labels or scalar; a DWI series fitted with
ball & sticks or CSD.

What a file becomes is :mod:`tractlens.app.loaders`' business; this controller runs the loading
jobs and puts the layers into the document. It holds no widget: the window hears of it through
:attr:`FileController.loaded`, :attr:`FileController.message` and :attr:`FileController.error`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QWidget

from tractlens.app.demo import demo_path
from tractlens.app.estimates import ballstick_estimate
from tractlens.app.loaders import (
    check_opened,
    check_pending,
    is_anatomical,
    load_layers,
    needs_gradient_files,
    show_as,
    withdraw_opened,
)
from tractlens.app.model import Document, Layer
from tractlens.app.usecases import fits

from .. import dialogs
from ..ballstick import brain_voxels_upper_bound
from ..csd_dialog import CANCEL_BATCH_VOXELS
from ..jobs import JobRunner

IMAGE_KINDS = ("scalar", "dwi", "rgb", "labels")
SESSION_SUFFIX = ".tractlens"


class FileController(QObject):
    """Loads files into ``document`` on ``runner``'s workers. ``open_session(path)`` opens a
    ``.tractlens`` path met among the files (a recent file, a drop)."""

    loaded = Signal(object)  # the Path of a file whose layers were added
    layer_replaced = Signal(object)  # the new Layer that took an old one's place (show as)
    message = Signal(str, int)  # status text, milliseconds
    error = Signal(str, str)  # message, details

    def __init__(
        self,
        document: Document,
        runner: JobRunner,
        *,
        device: str = "auto",
        open_session: Callable[[Path], object] | None = None,
        before_loading: Callable[[], object] | None = None,
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.document = document
        self.runner = runner
        self.device = device
        self.open_session = open_session
        self.before_loading = before_loading  # the views decide what the loading jobs prepare for them
        self._opening: dict[int, tuple[dict, int]] = {}  # open job -> (its open_paths call, slot)
        self._checking: dict[int, tuple[Layer, object]] = {}  # check job -> (layer, reference before it)
        runner.job_cancelled.connect(self._cancelled)

    def open_paths(self, paths: Iterable[str | os.PathLike], *, gradients: tuple[str, str] | None = None) -> list[int]:
        """Open each file on a worker thread; its layers are added when ready (the job ids).

        A diffusion series without ``.bval``/``.bvec`` beside it takes ``gradients`` (bval, bvec:
        ``tractlens view DWI --bval F --bvec F``), else the user chooses them
        (:func:`dialogs.gradient_files`); none chosen: it is not opened and the user is told why
        (a scripted run without queued answers says so at once, it never waits).

        The files of one call stack in the order given, the first at the bottom (as FSLeyes
        stacks its command line), whichever finishes loading first. An anatomical image
        (:func:`app.loaders.is_anatomical`: a T1 stored as integers, or named so) opened into a
        document that already shows images goes under them, so the maps stay on top of it."""
        if self.before_loading is not None:
            self.before_loading()
        call = {"slots": [], "under": [layer for layer in self.document.layers if layer.kind in IMAGE_KINDS]}
        jobs = []
        for path in paths:
            path = Path(path)
            if path.suffix.lower() == SESSION_SUFFIX and self.open_session is not None:
                self.open_session(path)
                continue
            reference = None
            if self.document.reference_affine is not None:
                reference = (self.document.reference_affine, self.document.reference_shape)
            chosen = gradients
            if chosen is None and needs_gradient_files(path):
                chosen = self.choose_gradients(path)
                if chosen is None:
                    self.error.emit(_no_gradients(path), "")
                    continue
            slot = len(call["slots"])
            call["slots"].append({"path": path, "layers": None, "state": "loading"})

            def failed(message, details, call=call, slot=slot) -> None:
                self.error.emit(message, details)
                self._opened(call, slot, None)

            job_id = self.runner.submit(
                f"open {path.name}",
                self._load_job(path, reference, chosen),
                on_done=lambda layers, call=call, slot=slot: self._opened(call, slot, layers),
                on_error=failed,
            )
            self._opening[job_id] = (call, slot)
            jobs.append(job_id)
        return jobs

    def choose_gradients(self, path: Path) -> tuple[str, str] | None:
        """Ask for the b-value and b-vector files of the diffusion series ``path`` (None: cancelled)."""
        parent = self.parent() if isinstance(self.parent(), QWidget) else None
        return dialogs.gradient_files(parent, path)

    def _load_job(self, path: Path, reference, gradients=None):
        device, fiber_arrays = self.device, self.document.fiber_arrays

        def job(ctx):
            layers = load_layers(
                path,
                reference=reference,
                device=device,
                progress=ctx.progress,
                cancelled=ctx.cancelled,
                gradients=gradients,
                check_positions=False,  # a .trx's positions: checked once it is drawn (_check_after)
            )
            for layer in layers:
                if layer.kind == "tractogram":  # O(points) display work stays off the GUI thread
                    ctx.progress(0, 1, "preparing the display")
                    fiber_arrays.prepare(layer)
            return layers

        return job

    def open_demo(self) -> int:
        """Load the built-in phantom: DTI maps (fitted on a worker) and its ground-truth bundles."""

        def job(ctx):
            ctx.progress(0, 1, "preparing the demo data")
            return demo_path()

        return self.runner.submit(
            "demo data",
            job,
            on_done=lambda folder: self.open_paths([folder / "dwi.nii.gz", folder / "bundles.trk"]),
            on_error=self.error.emit,
        )

    def _cancelled(self, job_id: int) -> None:
        if job_id in self._opening:
            self._opened(*self._opening[job_id], None)
        if job_id in self._checking:  # its open is not finished without the check: taken back out
            withdraw_opened(self.document, *self._checking.pop(job_id))

    def _opened(self, call: dict, slot: int, layers) -> None:
        """A file of an :meth:`open_paths` call is loaded (``layers``) or not (None): add the
        layers of every file up to the first still loading, in the call's order."""
        entry = call["slots"][slot]
        entry["layers"], entry["state"] = layers, "loaded" if layers is not None else "failed"
        self._opening = {k: v for k, v in self._opening.items() if not (v[0] is call and v[1] == slot)}
        for entry in call["slots"]:
            if entry["state"] == "loading":
                return
            if entry["state"] == "loaded":
                self._add_layers(entry["path"], entry["layers"], under=call["under"])
            entry["state"] = "added"

    def _add_layers(self, path: Path, layers, under: list[Layer] = ()) -> None:
        for layer in layers:
            reference_before = self.document.reference_affine
            self.document.add_layer(layer)
            below = [self.document.layers.index(old) for old in under if old in self.document.layers]
            if below and is_anatomical(layer):
                self.document.move_layer(layer, min(below))
            if check_pending(layer):
                self._check_after(path, layer, reference_before)
        self.loaded.emit(path)

    def _check_after(self, path: Path, layer: Layer, reference_before) -> int:
        """The positions of a .trx drawn before they were checked (:func:`app.loaders.check_opened`,
        one pass over the file on a worker): refused after all, the layer goes
        (:func:`app.loaders.withdraw_opened`) and the error says why, as opening would have;
        fine, the slice views (which wait for it) draw it too; cancelled, the layer goes (its open
        is not finished). The job id."""

        def refused(message: str, details: str) -> None:
            self._checking.pop(job_id, None)
            withdraw_opened(self.document, layer, reference_before)
            self.error.emit(message, details)

        def checked(_result) -> None:
            self._checking.pop(job_id, None)
            if layer in self.document.layers:
                layer.emit("display", changed=["positions"])  # the slice views draw it now

        job_id = self.runner.submit(
            f"check the positions of {path.name}", lambda ctx: check_opened(layer), on_done=checked, on_error=refused
        )
        self._checking[job_id] = (layer, reference_before)
        return job_id

    def show_layer_as(self, layer: Layer, kind: str) -> int:
        """The layer menu's "Show as labels / scalar": the image converted on a worker
        (:func:`app.loaders.show_as`) and put in the layer's place; the job id."""

        def done(new: Layer) -> None:
            if layer in self.document.layers:
                self.document.replace_layer(layer, new)
                self.layer_replaced.emit(new)

        return self.runner.submit(
            f"show {layer.name} as {kind}", lambda ctx: show_as(layer, kind), on_done=done, on_error=self.error.emit
        )

    def fit_ballstick(self, layer: Layer, params, folder: Path | None = None, roi: Layer | None = None) -> int:
        """Fit ball & sticks to a DWI layer's series on a worker, in the brain or inside ``roi`` (as
        it is now); the dyads and mean f1 layers are added when it is done (a cancelled or failed
        fit adds nothing). Returns the job id."""
        region = None if roi is None else (roi.data.mask.copy(), roi.data.affine.copy())
        dwi = layer.data.dwi
        voxels = roi.data.voxel_count if roi is not None else brain_voxels_upper_bound(dwi)
        estimate = ballstick_estimate(voxels, len(dwi.bvals), params.burnin, params.njumps, self.device)
        name = f"ball & sticks ({layer.name})" + (f", {estimate.text}" if estimate.long else "")
        if estimate.long:  # asked in the dialog; said again where the job shows (scripted runs too)
            self.message.emit(f"Started: {estimate.announcement()}", 30000)

        def done(outcome) -> None:
            layers, result = outcome
            for new in layers:
                new.provenance = {"computed": "ball & sticks (bedpostX)", "dwi": layer.name, **result.fit.provenance}
                self.document.add_layer(new)
            seconds = result.fit.provenance.get("total_s")
            text = f"Ball & sticks: {int(result.samples.mask.sum())} voxels fitted"
            text += f" in {seconds:.1f} s" if seconds is not None else ""
            text += f"; saved to {folder}" if folder is not None else ""
            self.message.emit("; ".join([text, *result.warnings]), 15000)

        return self.runner.submit(
            name,
            lambda ctx, device=self.device: fits.fit_ballstick(
                dwi, params, folder=folder, device=device, roi=region, ctx=ctx
            ),
            on_done=done,
            on_error=self.error.emit,
        )

    def fit_csd(self, layer: Layer, params, peak_params=None, folder: Path | None = None) -> int:
        """Fit fODFs by CSD to a DWI layer's series on a worker (:mod:`widgets.csd_dialog`); the
        fODF, peaks (and GM/CSF) layers are added when it is done, nothing after a cancel or a
        failure. Returns the job id."""
        name = f"CSD ({layer.name})"

        def done(outcome) -> None:
            layers, result = outcome
            for new in layers:
                new.provenance = {**new.provenance, "computed": "CSD", "dwi": layer.name, **result.fit.provenance}
                self.document.add_layer(new)
            seconds = result.fit.provenance.get("total_s")
            text = f"CSD: {int(result.mask.sum())} voxels fitted" + (f" in {seconds:.1f} s" if seconds else "")
            text += f"; saved to {folder}" if folder is not None else ""
            self.message.emit("; ".join([text, *result.warnings]), 15000)

        dwi, device = layer.data.dwi, self.device

        def job(ctx):
            return fits.fit_csd(
                dwi, params, peak_params, folder=folder, device=device, batch_voxels=CANCEL_BATCH_VOXELS, ctx=ctx
            )

        return self.runner.submit(name, job, on_done=done, on_error=self.error.emit)


def _no_gradients(path: Path) -> str:
    return (
        f"{path}: not opened: this diffusion series has no .bval/.bvec beside it and none were chosen. "
        "Open it again and choose its b-value and b-vector files, or run "
        "tractlens view DWI --bval FILE --bvec FILE"
    )
