"""Synthetic graphs for demos, tests and benchmarks."""
