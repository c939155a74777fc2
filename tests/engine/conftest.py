"""Engine fixtures: the tiny preset (fp32 and bf16, built once), cache settings over tmp_path stores."""

from __future__ import annotations

import pytest

from chunkstore.engine import load_model


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny")


@pytest.fixture(scope="session")
def tiny_bf16():
    return load_model("tiny", dtype="bfloat16")
