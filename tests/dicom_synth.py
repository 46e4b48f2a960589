"""DICOM series made in the tests from arrays whose truth is known (pydicom only).

A volume (X, Y, Z[, K]) with its RAS+ affine is written as a classic single-frame MR series:
one file per slice (and per volume of a diffusion series), the image plane from the affine's
first two columns, the slice positions from its third, the standard diffusion attributes
(0018,9087) b-value and (0018,9089) gradient direction (patient LPS frame) on each file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

LPS = np.diag([-1.0, -1.0, 1.0])


def rotation(axis: tuple[float, float, float], degrees: float) -> np.ndarray:
    """Rodrigues' rotation matrix about ``axis``."""
    a = np.asarray(axis, dtype=np.float64)
    a = a / np.linalg.norm(a)
    t = np.deg2rad(degrees)
    k = np.array([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return np.eye(3) + np.sin(t) * k + (1 - np.cos(t)) * (k @ k)


def make_affine(spacing=(2.0, 2.0, 2.5), *, oblique_deg: float = 0.0, flip_lr: bool = False, origin=None):
    """A RAS+ affine: LAS-stored (radiological) by default as scanners store, rotated for an
    oblique series, or stored left-to-right (x towards the right) with ``flip_lr``."""
    axes = np.diag([-1.0 if not flip_lr else 1.0, 1.0, 1.0]) @ np.diag(spacing)
    if oblique_deg:
        axes = rotation((1.0, 0.3, 0.2), oblique_deg) @ axes
    affine = np.eye(4)
    affine[:3, :3] = axes
    affine[:3, 3] = origin if origin is not None else (40.0, -30.0, -20.0)
    return affine


def write_series(
    folder: Path,
    data: np.ndarray,
    affine: np.ndarray,
    *,
    bvals=None,
    bvecs_world=None,
    description: str = "DWI",
    series_number: int = 1,
    patient_name: str = "Doe^Jane",
    patient_id: str = "PID-12345",
    study_uid: str | None = None,
    frame_uid: str | None = None,
    skip_slices: tuple[int, ...] = (),
    gradients: bool = True,
    manufacturer: str = "TractLensSynth",
) -> dict:
    """Write ``data`` as a classic MR series into ``folder``; returns its UIDs.

    ``bvecs_world``: (K, 3) gradient directions in RAS+ world space (zero rows for b=0).
    ``skip_slices``: slice indices not written (a half-copied series).
    ``gradients=False`` leaves the diffusion attributes out (a DWI without gradients)."""
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, MRImageStorage, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    data = np.asarray(data)
    volumes = data[..., None] if data.ndim == 3 else data
    nx, ny, nz, nk = volumes.shape
    lps = LPS @ np.asarray(affine, dtype=np.float64)[:3]
    col_step, row_step, slice_step = lps[:, 0], lps[:, 1], lps[:, 2]
    row_cos, col_cos = col_step / np.linalg.norm(col_step), row_step / np.linalg.norm(row_step)
    uids = {
        "study": study_uid or generate_uid(),
        "series": generate_uid(),
        "frame": frame_uid or generate_uid(),
    }
    scaled = np.clip(np.rint(volumes), 0, 65535).astype(np.uint16)
    instance = 0
    for k in range(nk):
        for z in range(nz):
            instance += 1
            if z in skip_slices:
                continue
            meta = FileMetaDataset()
            meta.MediaStorageSOPClassUID = MRImageStorage
            meta.MediaStorageSOPInstanceUID = generate_uid()
            meta.TransferSyntaxUID = ExplicitVRLittleEndian
            ds = FileDataset(None, {}, file_meta=meta, preamble=b"\0" * 128)
            ds.SOPClassUID = MRImageStorage
            ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
            ds.Modality = "MR"
            ds.Manufacturer = manufacturer
            ds.PatientName = patient_name
            ds.PatientID = patient_id
            ds.PatientBirthDate = "19700101"
            ds.PatientSex = "F"
            ds.StudyInstanceUID = uids["study"]
            ds.SeriesInstanceUID = uids["series"]
            ds.FrameOfReferenceUID = uids["frame"]
            ds.StudyDate, ds.StudyTime, ds.StudyID, ds.AccessionNumber = "20240102", "101010", "1", "ACC1"
            ds.SeriesDate, ds.SeriesTime = "20240102", "101500"
            ds.AcquisitionTime = "101500"
            ds.ReferringPhysicianName = "Ref^Doc"
            ds.SeriesNumber = series_number
            ds.SeriesDescription = description
            ds.ProtocolName = description
            ds.InstanceNumber = instance
            ds.AcquisitionNumber = 1
            ds.ImageType = ["ORIGINAL", "PRIMARY", "DIFFUSION" if bvals is not None else "M", "NONE"]
            ds.ScanningSequence, ds.SequenceVariant, ds.MRAcquisitionType = "EP", "NONE", "2D"
            ds.EchoTime, ds.RepetitionTime, ds.MagneticFieldStrength = 80.0, 5000.0, 3.0
            ds.ImagePositionPatient = [float(v) for v in lps @ np.array([0.0, 0.0, z, 1.0])]
            ds.ImageOrientationPatient = [float(v) for v in (*row_cos, *col_cos)]
            ds.PixelSpacing = [float(np.linalg.norm(row_step)), float(np.linalg.norm(col_step))]
            ds.SliceThickness = float(np.linalg.norm(slice_step))
            ds.SliceLocation = float(ds.ImagePositionPatient[2])
            ds.Rows, ds.Columns = ny, nx
            ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
            ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
            ds.PixelData = np.ascontiguousarray(scaled[:, :, z, k].T).tobytes()
            if bvals is not None and gradients:
                b = float(bvals[k])
                ds.add_new(0x00189087, "FD", b)
                ds.add_new(0x00189075, "CS", "DIRECTIONAL" if b > 0 else "NONE")
                if b > 0:
                    g = LPS @ np.asarray(bvecs_world[k], dtype=np.float64)
                    ds.add_new(0x00189089, "FD", [float(v) for v in g])
            pydicom.dcmwrite(folder / f"IM{series_number:02d}_{instance:05d}.dcm", ds, enforce_file_format=True)
    return uids


def gradient_table(n_dirs: int = 12, b: float = 1000.0, n_b0: int = 1, seed: int = 0):
    """b-values and unit directions (world RAS+) spread over the sphere (a Fibonacci lattice)."""
    i = np.arange(n_dirs) + 0.5
    phi = np.arccos(1 - 2 * i / n_dirs)
    theta = np.pi * (1 + 5**0.5) * i
    dirs = np.stack([np.cos(theta) * np.sin(phi), np.sin(theta) * np.sin(phi), np.cos(phi)], axis=1)
    bvals = np.concatenate([np.zeros(n_b0), np.full(n_dirs, b)])
    bvecs = np.concatenate([np.zeros((n_b0, 3)), dirs])
    return bvals, bvecs


def tensor_signal(shape, bvals, bvecs_world, affine, s0: float = 1000.0, seed: int = 0) -> np.ndarray:
    """A diffusion signal whose tensors vary over the volume (a prolate tensor along a direction
    that turns with x, in world space), with S0 varying smoothly, as whole numbers."""
    nx, ny, nz = shape
    x = np.linspace(0, np.pi / 2, nx)[:, None, None] * np.ones((1, ny, nz))
    e1 = np.stack([np.cos(x), np.sin(x), np.zeros_like(x)], axis=-1)
    lam_par, lam_perp = 1.7e-3, 0.3e-3
    g = np.asarray(bvecs_world, dtype=np.float64)
    dots = np.einsum("xyzc,kc->xyzk", e1, g)
    adc = lam_perp + (lam_par - lam_perp) * dots**2
    yy = np.linspace(0.8, 1.2, ny)[None, :, None, None]
    signal = s0 * yy * np.exp(-np.asarray(bvals)[None, None, None, :] * adc)
    return np.rint(signal).astype(np.float32)
