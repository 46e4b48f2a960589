#!/usr/bin/env bash
# Sourced by gui_on_gpu.sh and render_on_gpu.sh on the GPU machine: installs the carried parts
# (once per machine: Python packages in /tmp/site, missing Debian packages unpacked into /),
# starts Xvfb, checks GLX with the NVIDIA vendor library (hardware OpenGL) and falls back to Mesa's
# llvmpipe if that fails (GL=mesa forces llvmpipe). How the parts are prepared and carried:
# gui_on_gpu.sh's header.
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
# PyOpenGL (the gui extra: whole-brain tractograms drawn from the 3-D view's own OpenGL buffers) is a
# pure-Python wheel: carried as .whl/pyopengl-*.whl with the call and unpacked into /tmp/site when
# missing. Without it the view draws tractograms with VTK (bench_render.py's rows say which).
if ! python3 -c "import OpenGL" 2>/dev/null; then
  wheel=$(ls .whl/[Pp]y[Oo]pen[Gg][Ll]-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    python3 -m zipfile -e "$wheel" /tmp/site && echo "unpacked $wheel" | tee -a "$log"
  else
    echo "no PyOpenGL wheel in .whl/: tractograms will be drawn by VTK" | tee -a "$log"
  fi
fi
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

