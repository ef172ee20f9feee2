"""Benchmarks: aggregate speculative and AR event streams into measured speedups."""
