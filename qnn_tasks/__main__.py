"""`python -m qnn_tasks init [DIR]` (and socs, explain): the same as the `qnn-npu-compile` command."""
import sys

from qnn_tasks.cli import main

sys.exit(main())
