#!/usr/bin/env bash
# Stand-in for QAIRT's bin/check-linux-dependency.sh (tests only).
# The real script checks (and offers to apt-get install) the Debian/Ubuntu packages the SDK tools need
# (clang, libc++, make, python3-dev ...). The stand-in checks the commands its own tools use instead:
# a C compiler (cc/gcc: the stand-in model-lib generator and backend shim) and readelf (binutils).
missing=0
for cmd in cc readelf; do
  if command -v "$cmd" >/dev/null 2>&1; then
    echo "[INFO] $cmd: found ($(command -v "$cmd"))"
  else
    echo "[ERROR] $cmd: not found (install: apt-get install $([ "$cmd" = readelf ] && echo binutils || echo gcc))"
    missing=1
  fi
done
if [ "$missing" -ne 0 ]; then
  echo "[ERROR] Some dependencies are missing"
  exit 1
fi
echo "[INFO] All linux dependencies are installed"
