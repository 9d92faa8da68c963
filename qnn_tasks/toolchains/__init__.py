"""Toolchains behind one interface; the profile's `kind` picks the implementation."""
from __future__ import annotations

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec.project import ToolchainProfile
from qnn_tasks.toolchains.base import Toolchain

KINDS = ("ort-qnn", "qairt")


def from_profile(profile: ToolchainProfile) -> Toolchain:
    if profile.kind == "ort-qnn":
        from qnn_tasks.toolchains.ort_qnn import OrtQnnToolchain

        return OrtQnnToolchain(profile)
    if profile.kind == "qairt":
        from qnn_tasks.toolchains.qairt import QairtToolchain

        return QairtToolchain(profile)
    raise SpecError(profile.file, "kind", f"unknown toolchain kind '{profile.kind}'", f"use one of: {', '.join(KINDS)}")
