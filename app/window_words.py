"""Messages in the window's words. The use cases word their errors for the command line
(``--tensor-order fsl``, ``--device cpu``, ``--lmax 8``), and the command line's tests hold them
to it; the window has no flags, so every message it shows passes through :func:`window_words`
(one place): a known phrase becomes the window's wording, a parameter's flag becomes the label
its form shows (“SH order”, “δ”), and any other flag loses its dashes."""

from __future__ import annotations

import dataclasses
import re
from functools import cache

#: Phrases with a flag that the window says otherwise (the longest first is tried first).
PHRASES = {
    "with --tensor-order fsl (dtifit, tractlens), dipy or mrtrix": (
        "by opening the folder of its fit (dtifit or TractLens's DTI fit write FSL's order); a dipy or "
        "MRtrix tensor file needs its order named on the tractlens command line"
    ),
    "Run with --device cpu (or auto) to compute on the CPU": "Start TractLens on the CPU (device cpu or auto)",
    "run on a GPU (--device gpu)": "run on a GPU",
    "--device cpu": "the CPU",
    "--device gpu": "a GPU",
    "--device": "the compute device",
}
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


@cache
def _labels() -> dict[str, str]:
    """Every parameter's command-line flag -> the label its form shows."""
    from .cli.parameter_flags import cli_flags
    from .params import PARAMS_TYPES

    labels: dict[str, str] = {}
    for params_type in PARAMS_TYPES:
        for spec in dataclasses.fields(params_type):
            label = spec.metadata.get("label")
            for flag in cli_flags(params_type, spec.name) if label else ():
                labels.setdefault(flag, label)
    return labels


#: A command line the message suggests typing (``tractlens view DIR --series NUMBER``): it keeps its
#: flags, in the window too, up to the next comma, semicolon or bracket.
COMMAND = re.compile(r"\btractlens [a-z][\w-]*(?:[ \t]+[^\s,;()]+)*")


def window_words(message: str) -> str:
    """``message`` as the window shows it: no command-line flag left (see the module), except in a
    command line it suggests typing (:data:`COMMAND`)."""
    parts, last = [], 0
    for match in COMMAND.finditer(message):
        parts += [_in_words(message[last : match.start()]), match.group(0)]
        last = match.end()
    return "".join([*parts, _in_words(message[last:])])


def _in_words(text: str) -> str:
    for phrase in sorted(PHRASES, key=len, reverse=True):
        text = text.replace(phrase, PHRASES[phrase])
    labels = _labels()

    def word(match: re.Match) -> str:
        flag = match.group(0)
        return f"“{labels[flag]}”" if flag in labels else f"“{match.group(1).replace('-', ' ')}”"

    return FLAG.sub(word, text)


#: Backend names (``gpu.backend.Backend.name`` and older spellings) that mean the host's processor.
CPU_BACKENDS = ("cpu", "numpy", "")


def compute_device(provenance: dict) -> str:
    """Where a result was computed, in words: "the CPU", or "the GPU (NVIDIA H100 80GB HBM3)" with
    the card's name when the provenance has it. The CPU's own name (``x86_64``) is left out: it
    tells a user nothing the word CPU does not."""
    if str(provenance.get("backend", "")).lower() in CPU_BACKENDS:
        return "the CPU"
    return f"the GPU ({provenance['device']})" if provenance.get("device") else "the GPU"


def computed_on(provenance: dict) -> str:
    """``on the CPU`` / ``on the GPU (NVIDIA H100 …)``, for a panel's run summary."""
    return f"on {compute_device(provenance)}"


#: The compute device a user chose (``--device``), in words.
DEVICE_CHOICES = {"auto": "a GPU when one is usable, else the CPU", "cpu": "the CPU", "gpu": "the GPU"}


def device_choice(choice: str) -> str:
    """The ``--device`` choice in words (the report's header): ``auto`` -> "a GPU when one is usable, …"."""
    return DEVICE_CHOICES.get(str(choice).lower(), str(choice))


def seconds(value: float) -> str:
    """A run's time as the window writes it: ``1.25 s``; under 5 ms ``under 0.01 s``, not ``0.00 s``
    (which reads as "nothing was measured")."""
    value = float(value)
    return "under 0.01 s" if value < 0.005 else f"{value:.2f} s"
