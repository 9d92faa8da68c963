"""Make a toolchain profile's pinned environment now (the first build that needs it would):

    python -m qnn_tasks.toolchains.makeenv ort-qnn-2.47            # a packaged profile, or the project's
    python -m qnn_tasks.toolchains.makeenv toolchain/<name>.yaml

A command of its own, apart from toolchains/envs.py: it reads profiles with the spec loader, and no stage's code key
should hold the loader (a stage's key is every module it imports).
"""
from __future__ import annotations

import sys
from pathlib import Path

from qnn_tasks.toolchains.envs import ensure


def main(argv: list[str] | None = None) -> int:
    from qnn_tasks.errors import QnnTasksError
    from qnn_tasks.modelspec.load import load_toolchain

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m qnn_tasks.toolchains.makeenv <profile>|toolchain/<profile>.yaml ...", file=sys.stderr)
        return 2
    for arg in args:
        path = Path(arg)
        # toolchain/<name>.yaml (the project's, else the packaged one of that name), or just <name>
        root, name = (path.resolve().parent.parent, path.stem) if arg.endswith(".yaml") else (Path.cwd(), arg)
        try:
            profile = load_toolchain(root, name)
            if not profile.packages:
                print(f"{arg}: no packages: pinned, uses this interpreter")
                continue
            env = ensure(profile)
        except QnnTasksError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        print(f"{arg}: {env.path} ({', '.join(f'{p}={env.version(p)}' for p in ('onnxruntime', 'onnxruntime-qnn'))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
