"""Two report.json files compared field by field: is the second build's report the same as the first's?

What both reports hold (every graph, variant, target, pipeline, loop and size entry, by name, and the summary) is
compared value by value, with what differs between two runs of the same build left out: timings, digests and
keys, log paths, the interpreter's path. Entries only one report has (a model added since) and fields only one
has (a capability added since) are listed apart, by field, so a behaviour change cannot hide among them.

    python benchmarks/compare_reports.py BEFORE/build/report/report.json AFTER/build/report/report.json

Exit status 1 when a field both hold differs.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

SECTIONS = ("graphs", "variants", "targets", "pipelines", "loops", "sizes", "splits")
# a field whose value differs between two runs of the same build: measured times, digests, keys, logs, cache hits,
# the interpreter. Whole names or suffixes only: `onnxruntime` or `audio_seconds_per_sample` is no timing.
VOLATILE = re.compile(r"^(generated|elapsed|key|code|pid|log|made_from|from_cache|load|qnn_build_id|python|started|"
                      r"finished)$|(^|_)seconds$|(^|_)s$|per_second$|sha256|digest|_log$", re.I)


def flat(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from flat(inner, f"{path}.{key}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from flat(inner, f"{path}[{index}]")
    else:
        yield path, value


def entries(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`<section>:<name>` -> that entry's fields (path -> value); the summary as one entry."""
    found = {"summary": dict(flat(report.get("summary") or {}))}
    for section in SECTIONS:
        for item in report.get(section) or []:
            name = item.get("name") or f"{item.get('model')}/{item.get('graph')}/{item.get('precision')}"
            found[f"{section}:{name}"] = dict(flat(item))
    return found


def volatile(path: str) -> bool:
    names = [n for n in re.split(r"[.\[\]]", path) if n and not n.isdigit()]
    return any(VOLATILE.search(n) for n in names)


def same(a: Any, b: Any, roots: tuple[str, str]) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        a, b = a.replace(roots[0], "<root>"), b.replace(roots[1], "<root>")
    return a == b


def compare(before: dict[str, Any], after: dict[str, Any], roots: tuple[str, str] = ("", "")) -> dict[str, Any]:
    """{"equal": n, "differ": [(entry, field, before, after)], "entries_added": [...], "entries_removed": [...],
    "fields_added": {field: count}, "fields_removed": {field: count}} over the fields both entries hold."""
    a, b = entries(before), entries(after)
    result: dict[str, Any] = {"equal": 0, "differ": [], "entries_added": sorted(set(b) - set(a)),
                              "entries_removed": sorted(set(a) - set(b)),
                              "fields_added": collections.Counter(), "fields_removed": collections.Counter()}
    for name in sorted(set(a) & set(b)):
        fields_a, fields_b = a[name], b[name]
        for path in sorted(set(fields_a) | set(fields_b)):
            if volatile(path):
                continue
            shape = re.sub(r"\[\d+\]", "[]", path)
            if path not in fields_b:
                result["fields_removed"][shape] += 1
            elif path not in fields_a:
                result["fields_added"][shape] += 1
            elif same(fields_a[path], fields_b[path], roots):
                result["equal"] += 1
            else:
                result["differ"].append((name, path, fields_a[path], fields_b[path]))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    roots = tuple(str(p.resolve().parents[2]) for p in (args.before, args.after))  # <project>/build/report/report.json
    result = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), roots)
    differ = result["differ"]
    print(f"fields both reports hold: {result['equal'] + len(differ)}; equal {result['equal']}, differ {len(differ)}")
    for name, path, was, now in differ:
        print(f"  DIFFER {name}{path}: {str(was)[:100]} -> {str(now)[:100]}")
    for word in ("added", "removed"):
        listed = result[f"entries_{word}"]
        print(f"entries {word}: {len(listed)}" + (f" ({', '.join(listed[:12])}{' ...' if len(listed) > 12 else ''})"
                                                   if listed else ""))
    for word in ("added", "removed"):
        tops = collections.Counter()
        for shape, count in result[f"fields_{word}"].items():
            tops[".".join(shape.split(".")[:3 if shape.startswith(".stages") else 2])] += count
        print(f"fields {word} to entries both hold: {sum(tops.values())}"
              + (f" ({', '.join(f'{k} {n}' for k, n in tops.most_common(15))})" if tops else ""))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
