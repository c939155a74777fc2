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


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1e-5, seed=1), SamplingParams(temperature=100.0, seed=1),
    SamplingParams(temperature=1.0, top_p=5e-324, seed=1), SamplingParams(temperature=1e-5, top_p=1e-300, seed=1),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_no_temperature_or_top_p_in_range_gives_nan(params, dtype):
    logits = (torch.arange(259, dtype=torch.float32) * 60.0 - 8000.0).to(dtype)  # wide, as fp16 logits get
    token = Sampler(params, CPU).sample(logits)
    assert 0 <= token < 259


def test_a_temperature_below_the_epsilon_is_greedy():
    assert SamplingParams(temperature=5e-324).is_greedy and SamplingParams(temperature=9.9e-6).is_greedy
    assert not SamplingParams(temperature=1e-5).is_greedy
    logits = torch.tensor([0.0, 3.0, 1.0])
    assert Sampler(SamplingParams(temperature=1e-39, seed=5), CPU).sample(logits) == 1


def test_stop_lists_are_bounded():
    from chunkstore.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS
    SamplingParams(stop=["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS)
    with pytest.raises(ValueError, match="stop strings"):
        SamplingParams(stop=["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_STOP_CHARS}"):
        SamplingParams(stop=["x" * (MAX_STOP_CHARS + 1)])


def _reference(stops: list[str], deltas: list[str]) -> tuple[str, bool]:
    text = "".join(deltas)
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def test_stop_matching_equals_a_full_rescan():
    import random
    rng = random.Random(3)
    for _ in range(300):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        deltas = ["".join(rng.choice("abc") for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(1, 12))]
        out, streamed, fed = OutputText(stops), [], []
        for d in deltas:
            fed.append(d)
            streamed.append(out.append(d))
            if out.is_stopped:
                break
        streamed.append(out.finish())
        assert (out.text, out.is_stopped) == _reference(stops, fed), (stops, fed)
        assert "".join(streamed) == out.text
