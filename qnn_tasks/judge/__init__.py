"""Judging NPU outputs against the CPU: metrics, task checks, speech, samples, plots."""
