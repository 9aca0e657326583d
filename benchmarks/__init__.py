"""Benchmarks for ropekit, run side by side with the peer implementations: ``python -m benchmarks.run``.

Benchmarks measure; they never assert times. Results go to ``benchmarks/results/*.json``.
"""
