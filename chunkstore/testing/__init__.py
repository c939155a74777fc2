"""Test support that ships with the package: the crash soak (``chunkstore soak crash``, also driven
by the test suite) and the helpers tests share. Nothing in the layers below imports it."""
