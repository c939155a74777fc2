"""Sampling parameters, the seeded sampler, and stop strings over streamed text."""

from __future__ import annotations

import pytest
import torch

from chunkstore.engine.sampling import Sampler, SamplingParams
from chunkstore.engine.stops import OutputText

CPU = torch.device("cpu")


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_tokens=-1), "max_tokens"), (dict(max_tokens=1.5), "max_tokens"), (dict(temperature=-0.1), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(stop=[""]), "stop"), (dict(seed=-1), "seed"),
])
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_single_stop_string_is_a_tuple():
    assert SamplingParams(stop="\n").stop == ("\n",)


def draws(params: SamplingParams, logits: torch.Tensor, n: int = 50) -> list[int]:
    sampler = Sampler(params, CPU)
    return [sampler.sample(logits) for _ in range(n)]


def test_greedy_seeded_and_top_p():
    logits = torch.tensor([2.0, 1.9, 0.5, -1.0, -3.0])
    assert set(draws(SamplingParams(), logits)) == {0}
    hot = SamplingParams(temperature=1.0, seed=7)
    assert draws(hot, logits) == draws(hot, logits)  # the same seed, the same tokens
    assert draws(hot, logits) != draws(SamplingParams(temperature=1.0, seed=8), logits)
    assert len(set(draws(hot, logits, 400))) == 5
    # p(0) ~ 0.46, p(1) ~ 0.42: top_p 0.5 keeps exactly those two
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.5, seed=1), logits, 400)) == {0, 1}
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.01, seed=1), logits)) == {0}


def test_banned_ids_are_never_drawn():
    logits = torch.tensor([5.0, 0.0, 0.0])
    assert set(draws(SamplingParams(), logits)) == {0}
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3), CPU, banned_ids=[0])
    assert 0 not in {sampler.sample(logits) for _ in range(100)}


def feed(out: OutputText, pieces: list[str]) -> list[str]:
    emitted = [out.append(p) for p in pieces]
    return emitted + [out.finish()]


def test_stop_string_cuts_and_holds_back():
    out = OutputText(["END"])
    emitted = feed(out, ["abc E", "N", "D more"])
    assert out.is_stopped and out.text == "abc "
    assert emitted == ["abc ", "", "", ""]  # "E", then "EN", were held back until decided
    assert "".join(emitted) == out.text


def test_false_start_is_released():
    out = OutputText(["END"])
    assert feed(out, ["x E", "Nx", "y"]) == ["x ", "ENx", "y", ""]
    assert not out.is_stopped and out.text == "x ENxy"


def test_earliest_of_several_stops_wins():
    out = OutputText(["abc", "b"])
    feed(out, ["zab"])
    assert out.text == "za"
    with pytest.raises(ValueError):
        out.append("more")


def test_stop_spanning_many_deltas_and_no_stops():
    out = OutputText(["\n\n"])
    assert "".join(feed(out, ["one\n", "\ntwo"])) == "one" and out.is_stopped
    plain = OutputText()
    assert feed(plain, ["a", "b"]) == ["a", "b", ""]
