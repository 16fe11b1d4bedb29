"""Benchmarks: latency and retrieval quality of a running Engram (see bench/README.md)."""
