#!/usr/bin/env bash
# System libraries TractLens's window needs on Debian/Ubuntu: Qt's xcb platform,
# OpenGL (Mesa's llvmpipe when there is no GPU driver) for VTK, and Xvfb for the
# GUI tests. Uses sudo only when not root; does nothing when all are present.
set -euo pipefail
packages=(
  xvfb xauth
  libgl1 libegl1 libglx-mesa0 libgl1-mesa-dri libglu1-mesa
  libxkbcommon0 libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-shape0
  libxcb-xinerama0 libxcb-randr0 libxcb-render-util0 libxcb-image0 libxcb-xkb1 libxcb-xfixes0
  libxrender1 libxext6 libxi6 libsm6 libice6 libfontconfig1 libfreetype6 libdbus-1-3 fonts-dejavu-core
  poppler-utils  # pdftoppm, pdfinfo: the report tests render the PDF they export
)
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: no apt-get here; install the equivalents of: ${packages[*]}" >&2
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
