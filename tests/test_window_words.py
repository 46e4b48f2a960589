"""The window's wording of messages written for the command line (app.window_words)."""

from __future__ import annotations

import re

from tractlens.app.window_words import PHRASES, window_words

FLAG = re.compile(r"(?<![\w-])--[a-z]")


def test_known_phrases_parameter_flags_and_any_other_flag_become_words():
    assert window_words("Fit the CSD with --lmax 8 or lower") == "Fit the CSD with “SH order” 8 or lower"
    assert "(“δ”, “Δ”;" in window_words("in ms (--small-delta, --big-delta; e.g. HCP: 10.6 and 43.1)")
    assert window_words("Lower --fa-threshold or check") == "Lower “FA threshold” or check"
    assert window_words("Give --no-such-option") == "Give “no such option”"
    text = window_words("a GPU was requested. Run with --device cpu (or auto) to compute on the CPU.")
    assert "CPU" in text and not FLAG.search(text)
    for phrase in PHRASES:
        assert not FLAG.search(window_words(f"x {phrase} y")), phrase


def test_text_without_flags_is_left_as_it_is():
    for text in ("b = 1000 s/mm², 30 -- 60 directions", "left--right", "x -1 and --", ""):
        assert window_words(text) == text


def test_a_command_line_the_message_suggests_keeps_its_flags():
    text = "several diffusion series (run tractlens view DIR --series NUMBER, or tractlens import-dicom DIR --series 5 -o OUT)"
    assert window_words(text) == text
    mixed = window_words("Lower --fa-threshold, or run tractlens track deterministic --fa-threshold 0.1")
    assert mixed == "Lower “FA threshold”, or run tractlens track deterministic --fa-threshold 0.1"
    assert (
        window_words("or run tractlens view DWI --bval FILE --bvec FILE")
        == "or run tractlens view DWI --bval FILE --bvec FILE"
    )


def test_where_a_result_was_computed_is_said_in_words_with_the_card_named():
    from tractlens.app.window_words import compute_device, computed_on, device_choice

    assert computed_on({"backend": "cpu", "device": "x86_64"}) == "on the CPU"
    assert computed_on({"backend": "numpy"}) == computed_on({}) == "on the CPU"
    gpu = {"backend": "gpu", "device": "NVIDIA H100 80GB HBM3"}
    assert computed_on(gpu) == "on the GPU (NVIDIA H100 80GB HBM3)"
    assert compute_device({"backend": "gpu"}) == "the GPU"
    assert device_choice("cpu") == "the CPU" and "GPU" in device_choice("auto") and "--" not in device_choice("auto")


def test_the_report_says_the_compute_device_in_the_same_words():
    from tractlens.app.report_data import parameter_rows

    rows = dict(parameter_rows({"backend": "gpu", "device": "NVIDIA H100 80GB HBM3", "step_mm": 0.5}))
    assert rows["computed on"] == "the GPU (NVIDIA H100 80GB HBM3)"
    assert dict(parameter_rows({"backend": "cpu", "device": "x86_64"}))["computed on"] == "the CPU"


def test_a_run_time_under_five_milliseconds_is_not_written_as_zero():
    from tractlens.app.window_words import seconds

    assert seconds(0.001) == "under 0.01 s" and seconds(0.0) == "under 0.01 s"
    assert seconds(0.005) == "0.01 s" and seconds(12.345) == "12.35 s"
