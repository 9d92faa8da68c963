"""Build paths shared by several packages (the per-target ones are methods of the targets in plan/targets.py)."""
from __future__ import annotations

BUILD = "build"
DEVICE_STAMP = f"{BUILD}/verify/records.stamp"   # rewritten by stages/verify with every device record
DEVICES_FILE = "devices.json"                    # in build/verify/, build/power/: the attached phones, what they run
DEVICES_RECORD = f"{BUILD}/verify/{DEVICES_FILE}"
COMPAT_RECORD = f"{BUILD}/compat/compat.json"    # written by `doit compat`, read by the report and `doit verify`
REPORT_DIR = f"{BUILD}/report"
PROMOTED_FILE = "promoted.json"  # in a w8a16-mixed variant's repair/: the weights its quantize keeps at 16 bits


def project_record(stage: str, suffix: str = "") -> str:
    """The record of a project-wide on-demand stage (socscheck, toolcheck) for one toolchain of the run:
    build/<stage>.json for the first, build/<stage>-<profile>.json for the others (suffix "@<profile>")."""
    return f"{BUILD}/{stage}{suffix.replace('@', '-')}.json"


def project_dir(stage: str, suffix: str = "") -> str:
    """The folder of a project-wide stage's run for one toolchain (its error log, if it fails): build/<stage>[-<profile>]."""
    return f"{BUILD}/{stage}{suffix.replace('@', '-')}"
