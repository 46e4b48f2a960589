"""TractLens application core: data model, file formats, pipelines, command line. No widgets."""

from tractlens import __version__

__all__ = ["__version__"]
