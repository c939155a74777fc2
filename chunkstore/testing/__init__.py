"""Test support that ships with the package: the crash soak (``chunkstore soak crash``, also driven
by the test suite), the helpers tests share, and ``sglang_harness`` (SGLang's real HiCache
controller on the CPU, imported only where SGLang is installed). Nothing in the layers below
imports it."""
