"""Shipping what was verified (issue 32): the package per model, its manifest, the device-side choice, the AI pack."""
