"""DIPY's registration modules are imported without ``dipy.align``'s workflow API (app._dipy_start),
and the package is still whole for whoever asks for that API afterwards.

Each check runs in a fresh interpreter: the short way is only taken when ``dipy.align`` has not
been imported yet. A DIPY release that moves the names ``dipy/align/__init__.py`` defines before
importing ``dipy.align._public`` makes the first test fail (the ordinary import is then used,
correct but slower): look at that file and at :func:`app._dipy_start._split_init` again.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("dipy")


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_registration_modules_come_without_the_workflow_api():
    out = _run(
        "import json, sys\n"
        "from tractlens.app._dipy_start import import_align, MODULES\n"
        "mods = import_align()\n"
        "print(json.dumps({'names': [m.__name__ for m in mods],\n"
        "  'public': 'dipy.align._public' in sys.modules, 'io': 'dipy.io' in sys.modules,\n"
        "  'deferred': type(sys.modules['dipy.align']).__name__,\n"
        "  'classes': [hasattr(mods[0], 'AffineRegistration'), hasattr(mods[1], 'SymmetricDiffeomorphicRegistration'),\n"
        "              hasattr(mods[2], 'CCMetric'), hasattr(mods[3], 'RigidTransform3D')]}))"
    )
    assert out["names"] == ["dipy.align.imaffine", "dipy.align.imwarp", "dipy.align.metrics", "dipy.align.transforms"]
    assert out["classes"] == [True, True, True, True]
    # the short way was taken: DIPY's workflow API (and dipy.io, pandas, h5py behind it) not imported
    assert not out["public"], "dipy.align._public was imported: DIPY's __init__ changed shape (see the docstring)"
    assert not out["io"]
    assert out["deferred"] == "_DeferredAlign"


def test_the_package_is_whole_for_a_later_user_of_dipy_api():
    out = _run(
        "import json, sys\n"
        "from tractlens.app._dipy_start import import_align\n"
        "imaffine, *_ = import_align()\n"
        "import dipy.align\n"
        "from dipy.align import affine_registration, syn_registration\n"
        "import dipy.align.imaffine as again\n"
        "print(json.dumps({'all': sorted(dipy.align.__all__), 'same': again is imaffine,\n"
        "  'attr': dipy.align.imaffine is imaffine, 'cls': type(sys.modules['dipy.align']).__name__,\n"
        "  'public': affine_registration.__module__, 'floating': str(dipy.align.floating.__name__),\n"
        "  'verbosity': dipy.align.VerbosityLevels.DEBUG, 'missing': hasattr(dipy.align, 'no_such_name')}))"
    )
    plain = _run("import json, dipy.align; print(json.dumps({'all': sorted(dipy.align.__all__)}))")
    assert out["all"] == plain["all"]
    assert out["same"] and out["attr"]
    assert out["cls"] == "module"  # completed: an ordinary module again
    assert out["public"] == "dipy.align._public"
    assert out["floating"] == "float32" and out["verbosity"] == 3
    assert out["missing"] is False


def test_an_already_imported_dipy_align_is_used_as_it_is():
    out = _run(
        "import json, sys, dipy.align\n"
        "real = sys.modules['dipy.align']\n"
        "from tractlens.app._dipy_start import import_align\n"
        "mods = import_align()\n"
        "print(json.dumps({'kept': sys.modules['dipy.align'] is real, 'cls': type(real).__name__,\n"
        "  'same': mods[0] is sys.modules['dipy.align.imaffine']}))"
    )
    assert out == {"kept": True, "cls": "module", "same": True}


def test_an_init_without_the_public_import_falls_back_to_the_ordinary_import():
    out = _run(
        "import json, sys\n"
        "from tractlens.app import _dipy_start\n"
        "_dipy_start._split_init = lambda spec: None\n"
        "mods = _dipy_start.import_align()\n"
        "print(json.dumps({'cls': type(sys.modules['dipy.align']).__name__,\n"
        "  'public': 'dipy.align._public' in sys.modules, 'same': mods[0] is sys.modules['dipy.align.imaffine']}))"
    )
    assert out == {"cls": "module", "public": True, "same": True}


def test_a_failure_on_the_short_way_leaves_nothing_behind():
    out = _run(
        "import json, sys, importlib\n"
        "from tractlens.app import _dipy_start\n"
        "_dipy_start.MODULES = ('imaffine', 'no_such_module')\n"
        "took = _dipy_start._short_way()\n"
        "left = sorted(n for n in sys.modules if n == 'dipy.align' or n.startswith('dipy.align.'))\n"
        "import dipy\n"
        "print(json.dumps({'took': took, 'left': left, 'attr': hasattr(dipy, 'align')}))"
    )
    assert out == {"took": False, "left": [], "attr": False}
