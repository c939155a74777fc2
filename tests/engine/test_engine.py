"""The engine end to end: a real model, a real TieredCache over a tmp_path store, the scheduler thread."""

from __future__ import annotations

import json
import threading
import time

import pytest

from chunkstore.engine import (Engine, EngineClosedError, EngineConfig, FinishReason, PromptTooLongError,
                               QueueFullError, Request, SamplingParams, load_model)
from chunkstore.engine.tokenizer import TEXT_OUTPUT_BYTES
from tests.helpers.engine import PAGE_SIZE, cache_config
from tests.engine.test_loader import make_model_folder

STORY = "The cache keeps the attention keys and values of every prefix it has seen. " * 4
GREEDY = SamplingParams(max_tokens=24)
LONG = SamplingParams(max_tokens=3000, ignore_eos=True)


@pytest.fixture
def engine(tiny, tmp_path):
    with Engine(tiny, cache_config(tmp_path)) as e:
        yield e


def test_greedy_output_is_identical_after_a_restart_and_served_from_disk(tiny, tmp_path):
    config = cache_config(tmp_path)
    with Engine(tiny, config) as first:
        before = first.generate(Request(prompt=STORY, params=GREEDY))
        warm = first.generate(Request(prompt=STORY, params=GREEDY))
    assert before.cached_tokens == 0 and before.finish_reason is FinishReason.LENGTH
    assert warm.text == before.text and warm.cached_tokens == warm.device_tokens > 0
    with Engine(load_model("tiny"), config) as second:  # a new process would do the same
        after = second.generate(Request(prompt=STORY, params=GREEDY))
    assert after.text == before.text and after.token_ids == before.token_ids
    prompt_and_output_pages = (before.prompt_tokens + before.completion_tokens - 1) // PAGE_SIZE
    assert after.cached_tokens == after.disk_tokens == min(prompt_and_output_pages,
                                                            (after.prompt_tokens - 1) // PAGE_SIZE) * PAGE_SIZE


def test_next_turn_hits_the_previous_reply(engine):
    """The prompt and the generated tokens fed back are cached, so a next turn built on the reply's
    ids (as a client of /generate with input_ids does) reuses the reply too."""
    chat = [{"role": "user", "content": STORY}]
    first = engine.generate(Request(messages=chat, params=SamplingParams(max_tokens=40, ignore_eos=True)))
    prompt_ids = engine.tokenizer.encode_chat(chat)
    follow_up = engine.tokenizer.encode("\n<|user|>\nand then?\n<|assistant|>\n", add_special_tokens=False)
    second = engine.generate(Request(token_ids=prompt_ids + list(first.token_ids) + follow_up, params=GREEDY))
    fed = len(prompt_ids) + first.completion_tokens - 1  # the last token was returned, not fed
    assert second.cached_tokens == second.device_tokens == fed // PAGE_SIZE * PAGE_SIZE
    assert second.cached_tokens > len(prompt_ids)


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (1.0, 1), (2.0, 2)])
def test_a_preset_generates_text_that_encodes_back_to_its_ids(engine, temperature, seed):
    """The byte tokenizer masks every id but newline, printable ASCII and EOS: a random model would
    otherwise emit invalid UTF-8 (U+FFFD on decode, three other bytes on encode) and specials."""
    params = SamplingParams(max_tokens=600, temperature=temperature, seed=seed, ignore_eos=True)
    r = engine.generate(Request(prompt=STORY + "\u00e9\u00e8\t\r\x01", params=params))
    assert r.completion_tokens == 600 and set(r.token_ids) <= TEXT_OUTPUT_BYTES
    assert engine.tokenizer.encode(r.text, add_special_tokens=False) == list(r.token_ids)


def test_next_turn_rebuilt_from_the_reply_text_hits_the_reply(engine):
    """A chat client resends the history as text (the assistant turn is the reply's text, as SGLang's
    bench_multiturn.py does): it finds the prompt and every fed reply token, all but the last page."""
    chat = [{"role": "user", "content": STORY}]
    first = engine.generate(Request(messages=chat, params=SamplingParams(max_tokens=200, ignore_eos=True)))
    chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "and then?"}]
    second = engine.generate(Request(messages=chat, params=GREEDY))
    fed = first.prompt_tokens + first.completion_tokens - 1  # the last token was returned, not fed
    assert second.cached_tokens == fed // PAGE_SIZE * PAGE_SIZE


def test_busy_engine_prefetches_at_submit(tiny, tmp_path):
    config = cache_config(tmp_path)
    with Engine(tiny, config) as engine:
        engine.generate(Request(prompt=STORY, params=GREEDY))
    with Engine(tiny, config, EngineConfig(max_running_requests=1)) as engine:
        busy = engine.submit(Request(prompt="something else entirely", params=LONG))
        next(iter(busy))  # running: the next submit has a request ahead of it
        story_ids = engine.tokenizer.encode(STORY)
        assert engine.cache.peek(story_ids[:-1], "default")[1] == 0
        waiting = engine.submit(Request(prompt=STORY, params=GREEDY))
        deadline = time.monotonic() + 30
        while engine.cache.peek(story_ids[:-1], "default")[1] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the prefetch started by submit lands in host memory
        busy.cancel()
        result = waiting.result(30)
    assert result.cached_tokens == result.host_tokens > 0 and result.disk_tokens == 0


def test_seeded_sampling_is_reproducible(engine):
    params = SamplingParams(max_tokens=30, temperature=1.0, top_p=0.95, seed=1234, ignore_eos=True)
    a = engine.generate(Request(prompt=STORY, params=params))
    b = engine.generate(Request(prompt=STORY, params=params))  # now with a cache hit
    c = engine.generate(Request(prompt=STORY, params=SamplingParams(max_tokens=30, temperature=1.0, seed=99,
                                                                   ignore_eos=True)))
    assert a.token_ids == b.token_ids and b.cached_tokens > 0 and a.seed == 1234
    assert c.token_ids != a.token_ids
    greedy = engine.generate(Request(prompt=STORY, params=SamplingParams(max_tokens=30, ignore_eos=True)))
    assert greedy.token_ids != a.token_ids  # temperature 1 really samples


def test_stop_strings_and_max_tokens(engine):
    free = engine.generate(Request(prompt=STORY, params=SamplingParams(max_tokens=60, ignore_eos=True)))
    assert free.completion_tokens == 60 and free.finish_reason is FinishReason.LENGTH
    stop = next(free.text[i:i + 2] for i in range(5, len(free.text) - 2) if "\ufffd" not in free.text[i:i + 2])
    cut = engine.generate(Request(prompt=STORY, params=SamplingParams(max_tokens=60, ignore_eos=True, stop=[stop])))
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == free.text[:free.text.index(stop)] and stop not in cut.text
    assert cut.completion_tokens < 60
    none = engine.generate(Request(prompt=STORY, params=SamplingParams(max_tokens=0)))
    assert none.completion_tokens == 0 and none.text == "" and none.finish_reason is FinishReason.LENGTH


def test_stream_deltas_make_the_text(engine):
    handle = engine.submit(Request(prompt=STORY, params=SamplingParams(max_tokens=50, ignore_eos=True, stop=["zz"])))
    deltas = list(handle)
    result = handle.result()
    assert "".join(deltas) == result.text and len(deltas) > 1
    assert sum(d.num_tokens for d in deltas) == result.completion_tokens == 50  # every token streamed, once
    assert result.ttft_s <= result.latency_s and result.prompt_tokens == len(STORY) + 1


def test_queue_full_is_refused_without_harm(tiny, tmp_path):
    with Engine(tiny, cache_config(tmp_path), EngineConfig(max_queue_size=2, max_running_requests=1)) as engine:
        running = engine.submit(Request(prompt=STORY, params=LONG))
        next(iter(running))  # it is running: the queue is empty again
        queued = [engine.submit(Request(prompt=STORY, params=GREEDY)) for _ in range(2)]
        with pytest.raises(QueueFullError, match="queue is full"):
            engine.submit(Request(prompt=STORY, params=GREEDY))
        running.cancel()
        assert running.result(30).finish_reason is FinishReason.ABORT
        assert all(h.result(30).completion_tokens == GREEDY.max_tokens for h in queued)
        assert engine.is_alive


def test_too_long_prompt_and_bad_requests_are_refused(engine, tiny):
    with pytest.raises(PromptTooLongError, match=f"at most {tiny.max_positions}"):
        engine.submit(Request(token_ids=[65] * (tiny.max_positions + 1)))
    with pytest.raises(ValueError, match="token ids"):
        engine.submit(Request(token_ids=[65, 300]))
    with pytest.raises(ValueError, match="empty"):
        engine.submit(Request(token_ids=[]))
    with pytest.raises(ValueError, match="exactly one"):
        Request(prompt="a", token_ids=[1])
    with pytest.raises(ValueError, match="token ids"):
        engine.submit(Request(token_ids=[65, True]))
    one = engine.generate(Request(token_ids=[65], params=GREEDY))  # nothing to match, one token to compute
    assert one.cached_tokens == 0 and one.completion_tokens == GREEDY.max_tokens
    assert json.loads(json.dumps(one.as_dict()))["finish_reason"] == "length"
    # the longest allowed prompt runs, and stops when the positions run out
    edge = engine.generate(Request(token_ids=[65] * tiny.max_positions, params=GREEDY))
    assert edge.finish_reason is FinishReason.LENGTH and edge.completion_tokens == 1


def test_namespaces_isolate(tiny, tmp_path):
    config = cache_config(tmp_path)
    with Engine(tiny, config) as engine:
        engine.generate(Request(prompt=STORY, params=GREEDY, namespace="alice"))
        assert engine.generate(Request(prompt=STORY, params=GREEDY, namespace="alice")).cached_tokens > 0
        assert engine.generate(Request(prompt=STORY, params=GREEDY, namespace="bob")).cached_tokens == 0
    with Engine(tiny, config) as engine:
        assert engine.generate(Request(prompt=STORY, params=GREEDY, namespace="alice")).disk_tokens > 0
        assert engine.generate(Request(prompt=STORY + "!", params=GREEDY, namespace="carol")).cached_tokens == 0


def test_thread_survives_a_failing_request(engine):
    real_decode, calls = engine.runner.decode, []

    def failing_decode(seq, token_id):
        calls.append(token_id)
        if len(calls) == 3:
            raise RuntimeError("injected decode failure")
        return real_decode(seq, token_id)

    engine.runner.decode = failing_decode
    handle = engine.submit(Request(prompt=STORY, params=SamplingParams(max_tokens=10, ignore_eos=True)))
    with pytest.raises(RuntimeError, match="injected"):
        handle.result(30)
    with pytest.raises(RuntimeError, match="injected"):
        list(handle)
    assert engine.is_alive
    ok = engine.generate(Request(prompt=STORY, params=GREEDY), timeout_s=30)
    assert ok.completion_tokens == GREEDY.max_tokens and ok.cached_tokens == 0  # the failure cached nothing
    engine.flush()  # transfers done: what is left allocated is exactly what the tree holds
    stats = engine.stats()
    assert stats.device.locked_pages == 0 and stats.device.used_pages == stats.device.cached_pages


def test_running_requests_decode_in_one_batch_and_a_failed_batch_falls_back(tiny, tmp_path):
    with Engine(tiny, cache_config(tmp_path), EngineConfig(max_running_requests=3)) as engine:
        real, sizes = engine.runner.decode_batch, []

        def counting(seqs, token_ids):
            sizes.append(len(seqs))
            if len(sizes) == 2:
                raise RuntimeError("injected batch failure")  # raised before any sequence changed
            return real(seqs, token_ids)

        engine.runner.decode_batch = counting
        first = engine.submit(Request(prompt="a " + STORY, params=LONG))
        next(iter(first))  # running: the next two join it
        others = [engine.submit(Request(prompt=f"{i} " + STORY, params=SamplingParams(max_tokens=20, ignore_eos=True)))
                  for i in range(2)]
        results = [h.result(60) for h in others]
        first.cancel()
        assert all(r.completion_tokens == 20 for r in results)  # the failed batch was decoded one by one
        assert max(sizes) == 3 and len(sizes) > 2  # batches went on after the failure
        assert first.result(60).finish_reason is FinishReason.ABORT


def test_close_ends_running_and_fails_queued_requests(tiny, tmp_path):
    engine = Engine(tiny, cache_config(tmp_path), EngineConfig(max_running_requests=1))
    running = engine.submit(Request(prompt=STORY, params=LONG))
    next(iter(running))
    queued = engine.submit(Request(prompt=STORY, params=GREEDY))
    engine.close(timeout_s=30)
    assert not engine.is_alive
    assert running.result().finish_reason is FinishReason.ABORT
    with pytest.raises(EngineClosedError):
        queued.result()
    with pytest.raises(EngineClosedError):
        engine.submit(Request(prompt=STORY))
    with Engine(tiny, cache_config(tmp_path)) as again:  # the aborted request's pages were persisted
        assert again.generate(Request(prompt=STORY, params=GREEDY)).disk_tokens > 0


def test_concurrent_submitters_all_finish(tiny, tmp_path):
    with Engine(tiny, cache_config(tmp_path), EngineConfig(max_running_requests=3)) as engine:
        results, errors = [], []

        def client(i: int) -> None:
            try:
                for turn in range(3):
                    prompt = f"client {i} turn {turn}: " + STORY[: 40 * (turn + 1)]
                    results.append(engine.generate(Request(prompt=prompt, params=GREEDY), timeout_s=60))
            except Exception as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and len(results) == 12
    assert all(r.completion_tokens == GREEDY.max_tokens for r in results)


def test_model_folder_generates_and_hits(tmp_path):
    make_model_folder(tmp_path / "model")
    loaded = load_model(tmp_path / "model")
    chat = [{"role": "user", "content": "héllo wörld, " * 10}]
    with Engine(loaded, cache_config(tmp_path)) as engine:
        a = engine.generate(Request(messages=chat, params=GREEDY))
        b = engine.generate(Request(messages=chat, params=GREEDY))
    assert a.text == b.text and b.cached_tokens > 0


def test_max_tokens_is_capped_to_the_context_and_bad_text_is_an_invalid_prompt(engine, tiny):
    from chunkstore.engine import InvalidPromptError
    prompt = [65] * (tiny.max_positions - 2)
    handle = engine.submit(Request(token_ids=prompt, params=SamplingParams(max_tokens=10**12, ignore_eos=True)))
    assert handle.max_tokens == 3  # two positions left, and the last one predicts a token more
    result = handle.result(60)
    assert result.completion_tokens == 3 and result.finish_reason is FinishReason.LENGTH
    with pytest.raises(InvalidPromptError, match="not valid Unicode"):
        engine.submit(Request(prompt="a\ud800"))
    with pytest.raises(InvalidPromptError, match="empty"):
        engine.submit(Request(token_ids=[]))
