#!/usr/bin/env bash
# Install everything qnn-npu-compile and its examples/tests need, on Debian/Ubuntu x86-64 (Python >= 3.11).
#   - Debian packages: real audio for the VAD example (alsa-utils sounds, espeak-ng, sox),
#     chromium (the report's headless-browser check), adb (doit verify; its tests), jq (the documented CI gate), a JDK
#     with JUnit 4 and Android's org.json (the Java selector's tests).
#   - Python packages: this project with its example models, Dask, test tools and mkdocs (the docs). torch is pinned
#     first: an unpinned torch would pull a multi-GB CUDA build.
#   - The pinned environment of the packaged toolchain profile ort-qnn-2.47 (an older onnxruntime-qnn, made with uv).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

need=()
[ -d /usr/share/sounds/alsa ] || need+=(alsa-utils)
command -v espeak-ng >/dev/null || need+=(espeak-ng)
command -v sox >/dev/null || need+=(sox)
command -v chromium >/dev/null || need+=(chromium)
command -v adb >/dev/null || need+=(adb)
command -v jq >/dev/null || need+=(jq)   # the documented CI gate (docs/team.md), run by the tests
# the Java selector for apps (qnn_tasks/ship/java): compiled and unit-tested by tests/test_ship_select.py
command -v javac >/dev/null || need+=(default-jdk-headless)
[ -f /usr/share/java/junit4.jar ] || need+=(junit4)
[ -f /usr/share/java/com.android.json.jar ] || need+=(libandroid-json-java)   # Android's own org.json
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing Debian packages: ${need[*]}"
  # wait for another apt/dpkg (unattended upgrades, a second install) instead of failing at once
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q "${need[@]}"
fi

"$PYTHON" -m pip install -q torch==2.13.0
"$PYTHON" -m pip install -q -e '.[examples,team,test,docs]'
# The older QNN side by side (profile ort-qnn-2.47, qnn_tasks/data/toolchain/: onnxruntime-qnn 2.3.0 + onnxruntime 1.24.4) in its own
# environment, made with uv once; the tests build the examples under both toolchains.
"$PYTHON" -m qnn_tasks.toolchains.makeenv ort-qnn-2.47
# sed reads to the end: `head -1` closed the pipe early and doit died with a BrokenPipeError traceback
echo "installed: $("$PYTHON" -m doit --version | sed -n 1p), onnxruntime-qnn $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("onnxruntime-qnn"))')"
