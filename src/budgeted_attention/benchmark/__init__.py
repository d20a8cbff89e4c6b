"""Benchmark stage: interleaved CPU latency measurement of dense and pruned models."""
