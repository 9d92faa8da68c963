"""A `rewrites:` entry as model.yaml writes it, for the hints messages print (yaml only, imported when used)."""
from __future__ import annotations

from typing import Any, Mapping


def entry_yaml(name: str, options: Mapping[str, Any] | None = None) -> str:
    """One `rewrites:` entry: `name`, or `{name: {option: value}}`.

    Dumped by PyYAML, so it reads back as written (-1e4 dumps as -10000.0: YAML 1.1 reads "-1.0e4" as a string).
    """
    import yaml

    entry = {name: dict(options)} if options else name
    return yaml.safe_dump([entry], default_flow_style=True, sort_keys=False, width=2 ** 16).strip()[1:-1]
