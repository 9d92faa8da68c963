"""The rewrite catalogue's documented import path for export.py authors (`qnn_tasks.rewrites.apply`)."""
from qnn_tasks.graphs.rewrites import CATALOGUE, NAMES, apply, find  # noqa: F401
