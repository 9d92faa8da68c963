"""QNN artifacts: context binary reading, EPContext wrappers, runtime libraries, the chip check, and which binary a
device loads (select.py: the rules a package's app and `doit verify` follow; loadoracle.py: what a runtime refuses)."""
