"""Named bundles: published protocols (XTRACT) of seed, target, exclusion and stop regions in MNI
space, warped to a subject and tracked by name (``tractlens bundles``, Track ▸ Named bundles…).

:func:`run_bundles` is the use case; :func:`bundle_names` and :func:`bundle_colour` name and
colour the bundles for the window and the tractometry that reads the output folder.
"""

from ..params import BundleParams
from .protocols import bundle_colour, bundle_names, load_protocols, protocol_of, protocols_version
from .run import SUMMARY_FILE, BundleOutcome, BundlesResult, run_bundles

__all__ = [
    "SUMMARY_FILE",
    "BundleOutcome",
    "BundleParams",
    "BundlesResult",
    "bundle_colour",
    "bundle_names",
    "load_protocols",
    "protocol_of",
    "protocols_version",
    "run_bundles",
]
