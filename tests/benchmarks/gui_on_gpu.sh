#!/usr/bin/env bash
# The GUI on the GPU machine: live geodesic re-tracking (ROI edit -> fibres drawn) with the GPU
# engine, measured whole (tests/gui/test_geodesic_panel.py, gpu variant) under Xvfb.
#
# The GPU machine has CUDA, CuPy and numpy but no Qt, VTK, pyvista, X server or GL libraries, and
# no network; one call carries at most 64 MiB. So the parts are prepared here, on a machine with
# pip and apt (Debian 12 packages run there), carried in consecutive calls while the machine stays
# warm (it goes back 30 s after a call), and joined there. Prepare, in the repository root:
#
#   1. Wheels (cp312, manylinux x86_64), the versions of the dev venv:
#        pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
#          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d whl \
#          PySide6-Essentials==6.11.3 shiboken6==6.11.3 vtk==9.7.2 pyvista==0.49.1 \
#          pyvista-validation==0.2.2 pyvistaqt==0.13.1 scooby pooch platformdirs QtPy pytest-qt \
#          typing_extensions nibabel trx-python deepdiff orderly-set typer click rich \
#          markdown-it-py mdurl pygments shellingham cachebox hypothesis attrs sortedcontainers tqdm
#      (matplotlib, pillow, requests, h5py, scipy, pytest are already on the GPU machine.)
#   2. site.tar.xz: unzip every wheel but vtk into one folder; drop from PySide6 what the app
#      does not import (Qt/qml, Qt/translations, Qt/metatypes, the Quick/Qml/Designer/Wayland
#      libraries and plugins, the designer/linguist/qml* tools, *.pyi) -> ~100 MB, 38 MB as
#      `tar -cf - . | xz -T0 -3`.
#   3. vtk.tar.xz: the vtk wheel unzipped, `xz -3` (~100 MB), cut with `split -b 48m`.
#   4. Debian 12 packages: `apt-get download` of xvfb, x11-xkb-utils, xkb-data, the Mesa and
#      glvnd GL stack (libgl1-mesa-dri libglx-mesa0 libegl-mesa0 libgl1 libglx0 libegl1
#      libopengl0 libgles2 libglvnd0 libgbm1), mesa-utils (glxinfo), the xcb/xkbcommon/
#      fontconfig/freetype/glib/dbus libraries Qt's xcb plugin needs, and the closure of their
#      dependencies (`apt-cache depends --recurse --no-recommends ...`), ~67 MB.
#   5. Spread them over git-ignored folders of < 60 MiB each (build/gg1, build/gg2, ...), plus a
#      copy of the source tree (build/ggsrc, `git archive HEAD`). They must lie in the checkout
#      that the device call sends (a helper's worktree is not sent: its branch travels as
#      build/ggsrc), and the run below starts from build/ggsrc.
#
# On the GPU machine, one call per folder, back to back, each carrying its folder:
#   mkdir -p /tmp/gg/in && cp -r build/ggN/. /tmp/gg/in/
# and in the call that carries the last part and the source tree:
#   cp -r build/gg4/. /tmp/gg/in/ && cd build/ggsrc && bash tests/benchmarks/gui_on_gpu.sh
# `run` joins and installs the parts (Python packages in /tmp/site; each .deb whose package the
# machine lacks is unpacked into /, never over an existing file), starts Xvfb, checks GLX with
# the NVIDIA vendor library (`__GLX_VENDOR_LIBRARY_NAME=nvidia`: hardware OpenGL, as the machine
# notes say works) and falls back to Mesa's llvmpipe if that fails, then runs the test REPEAT
# times (default 3) with -s and prints the latency lines. GL=mesa forces llvmpipe. Results of
# 2026-11-24: tests/benchmarks/results/gui_on_gpu_h100.log. The figure counts from the second of
# two back-to-back ROI edits, so it includes live mode's coalescing wait (LIVE_INTERVAL_MS, 60 ms).
set -u
source "$(dirname "$0")/gui_env_on_gpu.sh"

# The gpu variant REPEAT times (each run a fresh process: window, demo, first tracking, then the
# live edit that is measured); CPU=1 adds the NumPy engine under the same renderer.
runs=$(seq "${REPEAT:-3}")
[ "${CPU:-0}" = 1 ] && runs="$runs cpu"
for i in $runs; do
  marker=gpu
  [ "$i" = cpu ] && marker="not gpu"
  echo "== run $i (-m '$marker')" >>"$OUT/pytest.log"
  python3 -m pytest tests/gui/test_geodesic_panel.py -m "$marker" -s -q -p no:cacheprovider 2>&1 |
    tee -a "$OUT/pytest.log" | grep -E "live re-track|passed|failed|Error" | head -20
done
grep -h "live re-track" "$OUT/pytest.log" >"$OUT/latency.txt"

# LIVE_PROB=1: also the live probabilistic benchmark (stroke -> first map, last stroke -> converged,
# on the HCP-sized field; bench_live_probabilistic.py) and the gpu variant of its GUI test.
if [ "${LIVE_PROB:-0}" = 1 ]; then
  python3 -m pytest tests/gui/test_probabilistic_gui.py -m gpu -q -p no:cacheprovider 2>&1 | tail -3 | tee -a "$log"
  python3 tests/benchmarks/bench_live_probabilistic.py --device gpu --out "$OUT/live_probabilistic_h100.json" \
    2>"$OUT/live_probabilistic.log" | tail -12
fi
