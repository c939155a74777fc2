"""Benchmarks behind ``chunkstore bench``: each module exposes ``add_arguments(parser)`` and
``run(args) -> exit code`` for the CLI, and a pure ``run_*_bench(config) -> dict`` for tests.

Invariant: a benchmark never asserts its own timing targets; it reports them with pass/fail.
"""
