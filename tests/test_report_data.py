"""The report's content in words (app.report_data): sidecar fields, parameters, no inf/nan."""

from __future__ import annotations

import json

from tractlens.app.report_data import (
    ScanInfo,
    parameters_in_words,
    read_scan_info,
    scan_info_from_sidecar,
    value_text,
)

SIDECAR = {
    "PatientName": "DOE^JANE",
    "PatientID": "P-0042",
    "PatientBirthDate": "19700412",
    "AcquisitionDateTime": "2026-03-01T10:22:05.000000",
    "StudyDate": "20260228",
    "SeriesDescription": "DTI_64dir_b1000",
    "ProtocolName": "ep2d_diff",
    "Manufacturer": "Siemens",
    "ManufacturersModelName": "Prisma",
    "MagneticFieldStrength": 3,
}


def test_fields_from_a_dcm2niix_sidecar_beside_the_nifti(tmp_path):
    (tmp_path / "dwi.nii.gz").write_bytes(b"")
    (tmp_path / "dwi.json").write_text(json.dumps(SIDECAR))
    info = read_scan_info(tmp_path / "dwi.nii.gz")
    assert info.patient_name == "DOE JANE" and info.patient_id == "P-0042"
    assert info.birth_date == "1970-04-12" and info.study_date == "2026-03-01"  # acquisition first
    assert info.series == "DTI_64dir_b1000" and info.protocol == "ep2d_diff"
    assert info.scanner == "Siemens Prisma" and info.field_strength == "3 T"
    assert read_scan_info(tmp_path / "other.nii.gz") is None
    (tmp_path / "bad.nii.gz").write_bytes(b"")
    (tmp_path / "bad.json").write_text("{not json")
    assert read_scan_info(tmp_path / "bad.nii.gz") is None


def test_study_date_falls_back_and_missing_fields_say_so():
    info = scan_info_from_sidecar({"StudyDate": "20250102"})
    assert info.study_date == "2025-01-02"
    assert dict(info.lines())["Patient"] == "not given"
    assert ScanInfo.from_dict(info.as_dict()) == info


def test_parameters_in_words_without_internal_keys_or_inf():
    provenance = {
        "computed": "deterministic tracking",
        "method": "deterministic",
        "parameters": {"step_mm": 0.5, "fa_threshold": 0.15, "max_angle_deg": 45.0, "max_length_mm": float("inf")},
        "backend": "cpu",
        "transfer_s": 0.01,
        "batches": 3,
        "tracking_s": 1.2,
        "device_choice": "small job",
        "seeds": 40,
        "closest_mm": float("inf"),
        "sd": float("nan"),
    }
    words = parameters_in_words(provenance)
    text = " · ".join(words)
    assert words[0] == "deterministic tracking"
    assert "step 0.5 mm" in text and "stop below FA 0.15" in text and "maximum turn 45° per step" in text
    assert "longest none (no limit)" in text and "closest not reached" in text and "sd none" in text
    for internal in ("transfer", "batches", "1.2", "small job", "device choice", "inf", "nan", "_"):
        assert internal not in text, internal


def test_values_in_words():
    assert value_text(float("inf")) == "not reached" and value_text(float("nan")) == "none"
    assert value_text(None) == "none" and value_text(True) == "yes" and value_text(0.123456) == "0.1235"


def test_the_probabilistic_curvature_threshold_reads_in_degrees_like_the_other_angles():
    from tractlens.app.report_data import parameter_rows

    rows = dict(parameter_rows({"computed": "probabilistic tracking", "parameters": {"cthr": 0.2, "step_mm": 0.5}}))
    assert rows["max angle"] == "78.5° (probtrackx curvature threshold 0.2)" and "cthr" not in rows


def test_numbered_choices_read_by_name_as_the_window_offers_them():
    from tractlens.app.report_data import parameter_rows

    rows = dict(parameter_rows({"parameters": {"randfib": 2, "n_samples": 1000}}))
    assert rows["first step's stick"] == "by volume fraction"
