"""Stand-in qnn-model-lib-generator: <name>.cpp + <name>.bin -> <out>/<target>/lib<name>.so per target.

Modelled: the real flags (-c/--cpp, -b/--bin, -t/--lib_targets, -l/--lib_name, -o/--output_dir; argparse
usage errors exit 2), the output layout, the library name (from the .bin, else qnn_model), LDFLAGS being
honoured, and aarch64-android needing the Android NDK (`ndk-build` on PATH, or in $ANDROID_NDK_ROOT): without it that target
fails with the reason, the other targets still build, and the exit code is 1.
Both libraries are real ELF shared objects that carry the .bin (the model's weights, as real model
libs do) and the graph name:
* x86_64-linux-clang: compiled from a small generated C file with the host C compiler (`cc`; the real
  tool uses clang++ on the generated C++); the .bin is embedded with `.incbin`. It exports the real
  entry points (QnnModel_composeGraphs, QnnModel_freeGraphsInfo; stubs here) and
  QnnStandin_graphName/QnnStandin_payload, which the stand-in context-binary generator calls.
* aarch64-android: no cross compiler exists here, so elf_aarch64.py writes the ELF itself; its LOAD
  alignment is LDFLAGS' -Wl,-z,max-page-size (0x1000 without it, like NDK r26's default).
Not modelled: compiling the graph (there is no QNN C++ graph in the stand-in .cpp).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import graph_name_from_cpp, sdk_version
from .elf_aarch64 import write_shared_object

TARGETS = ("aarch64-android", "x86_64-linux-clang", "aarch64-ubuntu-gcc9.4", "aarch64-oe-linux-gcc11.2",
           "aarch64-qnx", "windows-x86_64", "windows-aarch64")
BUILDABLE = ("aarch64-android", "x86_64-linux-clang")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qnn-model-lib-generator",
                                description="Compiles a QNN model .cpp/.bin into model libraries (stand-in).")
    p.add_argument("-c", "--cpp", required=True, help="Filepath for the qnn model .cpp file")
    p.add_argument("-b", "--bin", help="Filepath for the qnn model .bin file (weights)")
    p.add_argument("-t", "--lib_targets", nargs="+", action="extend", choices=TARGETS, metavar="LIB_TARGETS",
                   help="Specifies the targets to build the models for. Default: aarch64-android x86_64-linux-clang")
    p.add_argument("-l", "--lib_name", help="Specifies the name to use for libraries. Default: uses name in "
                                            "<model.bin> if provided, else generic qnn_model.so")
    p.add_argument("-o", "--output_dir", default="model_libs", help="Location for saving output libraries.")
    p.add_argument("--debug", action="store_true", help="Build debug libraries")
    return p


def info(message: str) -> None:
    print(f"[INFO] {message}", flush=True)


def error(message: str) -> None:
    print(f"[ERROR] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    cpp = Path(args.cpp)
    if not cpp.is_file():
        error(f"Model cpp file {cpp} does not exist")
        return 1
    if args.bin and not Path(args.bin).is_file():
        error(f"Model bin file {args.bin} does not exist")
        return 1
    graph = graph_name_from_cpp(cpp)
    if graph is None:
        error(f"{cpp}: not a model .cpp from qnn-onnx-converter (no graph found)")
        return 1
    payload = Path(args.bin).read_bytes() if args.bin else b""
    name = args.lib_name or (Path(args.bin).stem if args.bin else "qnn_model")
    targets = args.lib_targets or ["aarch64-android", "x86_64-linux-clang"]
    ldflags = os.environ.get("LDFLAGS", "")
    info(f"qnn-model-lib-generator (stand-in for QAIRT {sdk_version()})")
    info(f"Model cpp: {cpp}  bin: {args.bin}  graph: {graph}  LDFLAGS: '{ldflags}'")
    failed = []
    for target in dict.fromkeys(targets):
        out = Path(args.output_dir) / target / f"lib{name}.so"
        out.parent.mkdir(parents=True, exist_ok=True)
        info(f"Building target {target} -> {out}")
        if target not in BUILDABLE:
            error(f"{target}: stand-in builds only {', '.join(BUILDABLE)}")
            failed.append(target)
            continue
        problem = (build_host if target == "x86_64-linux-clang" else build_android)(out, name, graph, payload, ldflags)
        if problem:
            error(f"{target}: {problem}")
            failed.append(target)
            if out.exists():
                out.unlink()
        else:
            info(f"Built {out} ({out.stat().st_size} bytes)")
    if failed:
        error(f"Model library generation failed for target(s): {', '.join(failed)}")
        return 1
    info("Model library generation complete")
    return 0


def build_host(out: Path, name: str, graph: str, payload: bytes, ldflags: str) -> str | None:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        return "no host C compiler on PATH (the stand-in uses cc/gcc; the real tool needs clang++)"
    with tempfile.TemporaryDirectory(prefix="standin-modellib-") as tmp:
        blob = Path(tmp) / "payload.bin"
        blob.write_bytes(payload)
        source = Path(tmp) / f"{name}.c"
        source.write_text(HOST_SOURCE.replace("@PAYLOAD@", str(blob)).replace("@GRAPH@", graph))
        command = [compiler, "-shared", "-fPIC", "-O1", f"-Wl,-soname,lib{name}.so", "-o", str(out), str(source),
                   *shlex.split(ldflags)]
        print("  " + " ".join(shlex.quote(c) for c in command), flush=True)
        proc = subprocess.run(command, capture_output=True, text=True)
        sys.stdout.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            return f"compiler failed with exit code {proc.returncode}"
    return None


def build_android(out: Path, name: str, graph: str, payload: bytes, ldflags: str) -> str | None:
    ndk_root = os.environ.get("ANDROID_NDK_ROOT")
    ndk_build = shutil.which("ndk-build") or (shutil.which("ndk-build", path=ndk_root) if ndk_root else None)
    if not ndk_build:
        return ("ndk-build not found (not on PATH, no ANDROID_NDK_ROOT): the aarch64-android target needs the "
                "Android NDK (put its folder on PATH or set ANDROID_NDK_ROOT)")
    properties = Path(ndk_build).resolve().parent / "source.properties"
    revision = re.search(r"Pkg\.Revision\s*=\s*(\S+)", properties.read_text()) if properties.is_file() else None
    info(f"Android NDK: {Path(ndk_build).resolve().parent} (revision {revision.group(1) if revision else 'unknown'})")
    match = re.search(r"max-page-size[=,](0x[0-9a-fA-F]+|\d+)", ldflags)
    page = int(match.group(1), 0) if match else 0x1000
    write_shared_object(out, f"lib{name}.so", graph, payload, page_size=page)
    return None


HOST_SOURCE = r"""/* Generated by the STAND-IN qnn-model-lib-generator (tests only). */
#include <stddef.h>

__asm__(".section .rodata.qnn_standin_payload,\"a\",@progbits\n"
        ".balign 16\n"
        ".global qnn_standin_payload_start\n"
        "qnn_standin_payload_start:\n"
        ".incbin \"@PAYLOAD@\"\n"
        ".global qnn_standin_payload_end\n"
        "qnn_standin_payload_end:\n"
        ".previous\n");

extern const unsigned char qnn_standin_payload_start[];
extern const unsigned char qnn_standin_payload_end[];

const char* QnnStandin_graphName(void) { return "@GRAPH@"; }

const unsigned char* QnnStandin_payload(size_t* size) {
  *size = (size_t)(qnn_standin_payload_end - qnn_standin_payload_start);
  return qnn_standin_payload_start;
}

/* The real model-lib entry points; the stand-in composes no graphs here (MODEL_GRAPH_ERROR). */
int QnnModel_composeGraphs(void) { return 1; }
int QnnModel_freeGraphsInfo(void) { return 0; }
"""
