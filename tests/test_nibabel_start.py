"""The core imports nibabel without pydicom (app._nibabel_start), and nibabel still reads and writes
a NIfTI header's DICOM extension through the real pydicom."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
import tractlens.app
import nibabel as nib, nibabel.nifti1 as n, numpy as np
print("pydicom imported at start:", "pydicom" in sys.modules, "have_dicom:", n.have_dicom)
import pydicom
assert type(sys.modules["pydicom"]).__name__ == "module"
ds = pydicom.Dataset()
ds.PatientName = "Test^Name"
img = nib.Nifti1Image(np.zeros((2, 2, 2), np.float32), np.eye(4))
img.header.extensions.append(n.Nifti1DicomExtension(2, ds))
nib.save(img, sys.argv[1])
content = nib.load(sys.argv[1]).header.extensions[0].get_content()
print("read back:", type(content).__name__, content.PatientName, isinstance(content, n.DicomDataset))
"""


def test_pydicom_waits_until_nibabel_needs_it(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ext.nii")], capture_output=True, text=True,
                          cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "pydicom imported at start: False have_dicom: True"
    assert lines[1] == "read back: Dataset Test^Name True"
