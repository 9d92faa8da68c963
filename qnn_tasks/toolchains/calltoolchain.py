"""A call's toolchain object, built once per process from the call's profile (or the planner's own, in its process).

The runners of the stages a toolchain implements are in stages/toolchain.py; the executors ask here for a worker's
fingerprint of a call's toolchain.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only its profile is read: the call itself is run/'s, a floor above
    from qnn_tasks.run.calls import StageCall
    from qnn_tasks.toolchains.base import Toolchain

_TOOLCHAINS: dict[str, Any] = {}  # profile (JSON) -> toolchain object, one per process


def use_toolchain(profile: dict[str, Any], chain: Any) -> None:
    """Calls run in this process use the planner's own toolchain object for this profile."""
    _TOOLCHAINS[json.dumps(profile, sort_keys=True)] = chain


def toolchain(call: StageCall) -> Toolchain:
    """The call's toolchain object, built once per process and profile."""
    if call.toolchain is None:
        raise ValueError(f"stage {call.stage} has no toolchain")
    key = json.dumps(call.toolchain, sort_keys=True)
    if key not in _TOOLCHAINS:
        from qnn_tasks import toolchains
        from qnn_tasks.modelspec import specjson

        _TOOLCHAINS[key] = toolchains.from_profile(specjson.profile_from_dict(call.toolchain))
    return _TOOLCHAINS[key]
