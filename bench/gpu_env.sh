# bench/gpu_env.sh — sourced on the lent GPU machine, which has CUDA, PyTorch
# and Python but no meson, cmocka, uthash or network. The folder .deps (not
# in git; made by `bash bench/gpu_env.sh --fetch` on a machine with a package
# registry) carries Debian packages and a meson wheel; this unpacks them under
# /tmp/deps (never into /) and points the build at them.
#
#   bash bench/gpu_env.sh --fetch   on a machine with apt and pip: fill .deps
#   . bench/gpu_env.sh              on the GPU machine: set up PATH and friends
if [ "${1:-}" = "--fetch" ]; then
  set -e
  mkdir -p .deps && cd .deps
  apt-get download libcmocka0 libcmocka-dev uthash-dev pkgconf pkgconf-bin libpkgconf3 ninja-build
  python3 -m pip download --no-deps --only-binary=:all: -d . meson==1.5.2
  exit 0
fi
D=/tmp/deps
# Unpacked once per machine: the marker is written last, so a run without
# .deps (nothing carried) leaves none and the next run that carries it unpacks.
if [ ! -f $D/.unpacked ] && ls .deps/*.deb > /dev/null 2>&1; then
  mkdir -p $D
  for f in .deps/*.deb; do dpkg -x "$f" $D; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target $D/site .deps/meson-*.whl
  printf '#!/bin/sh\nexec python3 -m mesonbuild.mesonmain "$@"\n' > $D/usr/bin/meson
  chmod +x $D/usr/bin/meson
  touch $D/.unpacked
fi
export PYTHONPATH=$D/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=$D/usr/bin:/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$D
export CFLAGS="-I$D/usr/include"
