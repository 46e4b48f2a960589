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
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log=$OUT/setup.log
in=/tmp/gg/in
if [ ! -e /tmp/gg/installed ]; then
  mkdir -p /tmp/site /tmp/gg/root
  cat "$in"/vtk.tar.xz.part-* | tar -xJf - -C /tmp/site || exit 1
  tar -xJf "$in/site.tar.xz" -C /tmp/site || exit 1
  added=()
  for deb in "$in"/*.deb; do
    pkg=$(dpkg-deb -f "$deb" Package)
    # a package the machine has stays as it is; a missing one is unpacked next to it
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" && continue
    dpkg -x "$deb" /tmp/gg/root && added+=("$pkg")
  done
  # Debian 12 packages put some files in /lib, /bin, /sbin: where those are links into /usr
  # (merged /usr), move them there first, so that copying does not meet a link.
  for d in lib lib64 bin sbin; do
    if [ -L "/$d" ] && [ -d "/tmp/gg/root/$d" ]; then
      mkdir -p "/tmp/gg/root/usr/$d" && cp -a "/tmp/gg/root/$d/." "/tmp/gg/root/usr/$d/" && rm -rf "/tmp/gg/root/$d"
    fi
  done
  cp -an /tmp/gg/root/. / # no file of the machine is overwritten
  ldconfig
  echo "unpacked ${#added[@]} packages: ${added[*]}" | tee -a "$log"
  touch /tmp/gg/installed
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
export TRACTLENS_TEST_CACHE=/tmp/gg/cache

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$log"
if ! pgrep -x Xvfb >/dev/null; then
  setsid Xvfb :99 -screen 0 1920x1080x24 +extension GLX -nolisten tcp >"$OUT/xvfb.log" 2>&1 &
  sleep 2
fi
export DISPLAY=:99
glx() { glxinfo -B >"$OUT/glxinfo.txt" 2>&1; }
if [ "${GL:-nvidia}" = nvidia ]; then
  export __GLX_VENDOR_LIBRARY_NAME=nvidia
  if ! glx || ! grep -q NVIDIA "$OUT/glxinfo.txt"; then
    { echo "NVIDIA GLX failed under Xvfb:"; cat "$OUT/glxinfo.txt"; echo "falling back to Mesa llvmpipe"; } | tee -a "$log"
    unset __GLX_VENDOR_LIBRARY_NAME
    glx
  fi
else
  glx
fi
grep -E "vendor string|renderer string|version string" "$OUT/glxinfo.txt" | tee -a "$log"
python3 -c "import cupy, PySide6, vtk, pyvista; print('cupy', cupy.__version__, 'PySide6', PySide6.__version__,
  'vtk', vtk.__version__, 'pyvista', pyvista.__version__)" 2>&1 | tee -a "$log"

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
