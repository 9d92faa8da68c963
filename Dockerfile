# qnn-npu-compile in a Linux x86-64 image, for macOS and Windows users: the QAIRT SDK's tools run on
# Linux x86-64 only, and the onnxruntime-qnn wheel (compile + x86 HTP simulator) exists only there.
#
#   docker build --platform linux/amd64 -t qnn-npu-compile .
#   docker run --rm -v "$PWD":/work -v /path/to/qairt:/opt/qairt qnn-npu-compile doit
#   docker run --rm -v "$PWD":/work qnn-npu-compile qnn-npu-compile init .     # scaffold a project in $PWD
#
# /path/to/qairt is the folder that holds the SDK's version folder (qairt/2.40.0.251030/ ...). The SDK
# is NOT in the image: its licence does not allow redistributing it; download it yourself. For another
# version: docker run ... -e QNN_SDK_ROOT=/opt/qairt/<version> ... (or build with --build-arg QAIRT_VERSION=).
# The image selects the qairt toolchain (QNN_TOOLCHAIN=qairt); -e QNN_TOOLCHAIN=ort-qnn uses the pip one.
# `doit toolcheck` runs the SDK's dependency checks inside the image.
# On Apple silicon the image runs under x86-64 emulation: it works, slowly.
FROM --platform=linux/amd64 python:3.11-slim-bookworm

ARG QAIRT_VERSION=2.40.0.251030
ARG NDK_VERSION=r26d
ARG UV_VERSION=0.13.9
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# - binutils: readelf, for the 16 KB page check of the aarch64 model libraries
# - adb: Android phones (verification on devices)
# - clang, make, libc++: what the SDK's qnn-model-lib-generator compiles host model libraries with
#   (bin/check-linux-dependency.sh names the exact packages; run `doit toolcheck`)
# - gcc: the stand-in SDK the tests use; curl/unzip: the NDK download
# - alsa-utils, espeak-ng, sox: real audio for the silero-vad example
# - default-jdk-headless, junit4, libandroid-json-java: the Java selector for apps (qnn_tasks/ship/java) and its tests
# - jq: the documented CI gate on build/report/report.json (docs/team.md)
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      binutils adb clang make libc++-dev libc++abi-dev gcc libc6-dev \
      curl ca-certificates unzip \
      alsa-utils espeak-ng sox \
      default-jdk-headless junit4 libandroid-json-java jq \
 && rm -rf /var/lib/apt/lists/*

# Android NDK r26+ for the aarch64-android model libraries (the modellib stage links them with
# LDFLAGS=-Wl,-z,max-page-size=16384). Downloading the NDK means accepting the Android Software
# Development Kit License Agreement: https://developer.android.com/studio/terms
RUN curl -fsSL -o /tmp/ndk.zip "https://dl.google.com/android/repository/android-ndk-${NDK_VERSION}-linux.zip" \
 && unzip -q /tmp/ndk.zip -d /opt \
 && rm /tmp/ndk.zip \
 && ln -s "/opt/android-ndk-${NDK_VERSION}" /opt/android-ndk
ENV ANDROID_NDK_ROOT=/opt/android-ndk

# The SDK converter's own interpreter: Python 3.10 with numpy<2 and onnx==1.17.0 (not this tool's 3.11).
# bookworm has no python3.10 package, so uv installs a standalone CPython 3.10 into a venv at the path
# the packaged qairt profile names (settings.python; a project's toolchain/qairt.yaml may override it). The extra packages are what the SDK's
# bin/check-python-dependency asks for (sherpa-onnx installs the same list).
ENV UV_PYTHON_INSTALL_DIR=/opt/uv-python
RUN pip install "uv==${UV_VERSION}" \
 && uv python install 3.10 \
 && uv venv --python 3.10 /opt/qairt-py310 \
 && uv pip install --python /opt/qairt-py310/bin/python \
      "numpy<2" onnx==1.17.0 onnxruntime onnxsim \
      packaging protobuf pyyaml pandas psutil pydantic rich scipy six tabulate typing-extensions

# This tool (Python 3.11), installed from its wheel exactly as a team installs it (not editable, not a copy
# of the repository): the wheel carries the SoC table and toolchain profiles (qnn_tasks/data/), and the
# mounted project's own socs/ and toolchain/ add to or override them. The wheel and the sources are
# removed in the same layer, so the image holds only the installed package. torch is pinned and taken from PyTorch's CPU
# index: an unpinned torch pulls a multi-GB CUDA build (only here: the image is built outside the
# project's machines, where the pinned wheel is local).
WORKDIR /opt/qnn-npu-compile
COPY pyproject.toml README.md ./
COPY qnn_tasks ./qnn_tasks
RUN pip wheel --no-deps -w /tmp/dist . \
 && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install "$(ls /tmp/dist/qnn_npu_compile-*.whl)[examples,test]" \
 && cd / && rm -rf /tmp/dist /opt/qnn-npu-compile \
 && qnn-npu-compile socs /tmp >/dev/null

# The SDK is mounted at /opt/qairt by the user; QNN_SDK_ROOT is what `source .../bin/envsetup.sh` sets.
ENV QNN_TOOLCHAIN=qairt \
    QNN_SDK_ROOT=/opt/qairt/${QAIRT_VERSION}
WORKDIR /work
CMD ["doit"]
