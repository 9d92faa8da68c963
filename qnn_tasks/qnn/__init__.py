"""QNN artifacts: context binary reading, EPContext wrappers, runtime libraries, the chip check."""
