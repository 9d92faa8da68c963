"""The `qnn-npu-compile` console command (also `python -m qnn_tasks`).

    qnn-npu-compile init [DIR]       scaffold a project: dodo.py, models/, socs/socs.yaml, .gitignore, a CI workflow
    qnn-npu-compile socs [DIR]       the SoC table the project in DIR (default .) builds with, and where each row comes from
    qnn-npu-compile explain LOG ...  the QNN error codes in compile/simulator/phone logs (or codes: 3110, 0x36b1,
                                     QNN_..._ERROR_...), one line each with the fix

Building is `doit` in the project folder (`doit list --all` shows every target).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from qnn_tasks.errors import QnnTasksError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qnn-npu-compile", description=__doc__.splitlines()[0],
                                     epilog="Build with `doit` in the project folder.")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="scaffold a project (refuses to overwrite any file)")
    init.add_argument("dir", nargs="?", default=".", help="the project folder (created if missing; default: .)")
    socs = commands.add_parser("socs", help="list the SoC table: the packaged rows with the project's over them")
    socs.add_argument("dir", nargs="?", default=".", help="the project folder (default: .)")
    explain = commands.add_parser("explain", help="explain the QNN error codes found in log files, or codes as typed")
    explain.add_argument("logs", nargs="+", type=Path, help="log files, or codes: 3110, 0x36b1, QNN_..._ERROR_...")
    explain.add_argument("--stage", default="compile", choices=("compile", "fallback", "load", "phone"),
                         help="where the log comes from (chooses the fix; default: compile)")
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            return _init(Path(args.dir))
        if args.command == "socs":
            return _socs(Path(args.dir))
        return _explain(args.logs, args.stage)
    except QnnTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `qnn-npu-compile socs | head`
        sys.stderr.close()
        return 0


def _init(target: Path) -> int:
    from qnn_tasks.scaffold import init

    written = init(target)
    for path in written:
        print(f"wrote {path}")
    print(f"next: cd {target} && edit models/example/model.yaml (or add models/<model>/), then `doit list --all` and `doit`")
    return 0


def _socs(root: Path) -> int:
    from qnn_tasks.modelspec.load import load_soc_table

    if not root.is_dir():  # else the packaged table alone would be listed as if it were this project's
        raise QnnTasksError(f"{root}: no such folder (fix: name the project folder, the one that holds socs/ and "
                            "models/; without socs/socs.yaml it builds with the packaged table)")
    table, default = load_soc_table(root)
    print(f"{'SoC':<9} {'soc_id':>6} {'arch':<4} {'runs':<11} {'ctx MB':>6} {'default':<7} note (file)")
    for soc in table.values():
        mark = "yes" if soc.name in default else ""
        print(f"{soc.name:<9} {soc.soc_id:>6} {soc.dsp_arch:<4} {'+'.join(soc.runs):<11} {soc.context_mb:>6} {mark:<7} "
              f"{soc.note} ({soc.file})")
    return 0


def _explain(logs: list[Path], stage: str) -> int:
    from qnn_tasks.qnn.errorcodes import explain, explain_file

    found = 0
    for log in logs:
        code = None if log.is_file() else _as_code(str(log))
        if code is not None:  # a code as users type it: 3110, 0x36b1, QNN_CONTEXT_ERROR_INVALID_ARGUMENT
            lines = explain(code, stage)
            if not lines:
                print(f"error: {log}: not a QNN error code of the catalogue (fix: see qnn_tasks/data/qnn_errors.yaml "
                      "for the known codes, or name a log file)", file=sys.stderr)
                return 2
            for line in lines:
                print(line)
                found += 1
            continue
        if not log.is_file():
            print(f"error: {log}: not found (fix: name a log file, or a QNN error code such as 3110)", file=sys.stderr)
            return 2
        for line in explain_file(log, stage):
            print(f"{log}: {line}")
            found += 1
    if not found:
        print("no known QNN error code in these logs (the catalogue: qnn_tasks/data/qnn_errors.yaml)")
    return 0


def _as_code(text: str) -> str | None:
    """A QNN error code as typed (3110, 0x36b1, a QNN_..._ERROR_... name) as log text the catalogue finds, else None."""
    if re.fullmatch(r"\d{1,6}|0[xX][0-9a-fA-F]{1,5}", text):
        return f"error code {text}"
    return text if re.fullmatch(r"QNN_[A-Z0-9_]+", text) else None


if __name__ == "__main__":
    sys.exit(main())
