"""scripts/install.sh's last line is what a newcomer reads: it must never be a Python traceback (issue 35).

`doit --version | head -1` let head close the pipe while doit still wrote: a BrokenPipeError traceback on a loaded
machine. The script's own `installed:` line is run here with a `python` whose `-m` module writes 200,000 lines
(what makes the race certain), and the real one for the rest.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_installed_line_survives_a_version_command_that_keeps_writing(tmp_path):
    [line] = [row for row in (ROOT / "scripts" / "install.sh").read_text().splitlines()
              if row.startswith('echo "installed: ')]
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n"
                      f'if [ "$1" = "-m" ]; then exec {sys.executable} -c "for i in range(200000): print(\'doit\', i)"; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    run = subprocess.run(["bash", "-c", f"set -euo pipefail; PYTHON={python}; {line}"], capture_output=True, text=True,
                         timeout=120)
    assert "Traceback" not in run.stderr and "BrokenPipeError" not in run.stderr, run.stderr
    assert run.returncode == 0 and run.stdout.startswith("installed: doit 0, onnxruntime-qnn "), run.stdout
