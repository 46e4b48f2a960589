"""TractLens application core: data model, file formats, pipelines, command line. No widgets."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tractlens")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.1.0.dev0"
