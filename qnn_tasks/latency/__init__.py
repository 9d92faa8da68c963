"""Phone latency before the phone: graph features from the ONNX (features), and an estimate per chip x precision
fitted to AI Hub Models' published on-device timings (estimate; fitted by benchmarks/bench_latency_fit.py)."""
