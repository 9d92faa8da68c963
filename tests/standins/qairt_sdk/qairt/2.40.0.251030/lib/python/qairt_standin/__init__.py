"""Stand-in for the QAIRT SDK's Python tooling (tests only; the real SDK is proprietary).

The real SDK ships its converters under lib/python/qti/aisw/...; this package plays that part for
the stand-in tools in ../../bin/x86_64-linux-clang/. What it models and what it does not is
written in ../../../../README.md (tests/standins/qairt_sdk/README.md).
"""
