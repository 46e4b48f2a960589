"""The one exception type for input a user can fix."""

from __future__ import annotations

import os


class InputError(ValueError):
    """Bad input: names the file, says what is wrong and what to do about it.

    ``str(error)`` is a one-paragraph message meant for a clinician or a script's
    log, never a traceback.
    """

    def __init__(self, problem: str, *, path: str | os.PathLike | None = None, fix: str = ""):
        self.path = os.fspath(path) if path is not None else None
        self.problem = problem
        self.fix = fix
        parts = []
        if self.path:
            parts.append(f"{self.path}: {problem}")
        else:
            parts.append(problem)
        text = parts[0].rstrip(".") + "."
        if fix:
            text += " " + fix.rstrip(".") + "."
        super().__init__(text)
