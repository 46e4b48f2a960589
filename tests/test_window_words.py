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
