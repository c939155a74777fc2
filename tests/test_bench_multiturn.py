"""`chunkstore bench multiturn` on the tiny preset and a tiny workload: every reported key present and sane,
hit rates ordered where the workload makes them deterministic, the ideal hit rate right, the PNG written,
the --url client against a stand-in server, bad options refused. Timing is never asserted."""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from chunkstore.bench import multiturn as bench
from chunkstore.bench.workload import Reply, Workload, drive, ideal_cached_tokens
from chunkstore.cache.layout import KVLayout
from chunkstore.disk.identity import ModelIdentity

pytestmark = pytest.mark.slow  # real benchmark runs: left out of the fast subset

CLIENTS, ROUNDS, QUESTION, OUTPUT, PAGE = 4, 3, 40, 3, 16
TINY = ["--preset", "tiny", "--num-clients", str(CLIENTS), "--num-rounds", str(ROUNDS), "--request-length",
        str(QUESTION), "--output-length", str(OUTPUT), "--page-size", str(PAGE), "--max-parallel", "1",
        "--request-rate", "inf", "--no-progress"]
RUN_KEYS = ("name", "description", "num_requests", "prompt_tokens", "cached_tokens", "completion_tokens",
            "hit_rate", "hit_rate_by_tier", "ideal_hit_rate", "hit_rate_vs_ideal", "ttft_avg_s", "ttft_p50_s",
            "ttft_p90_s", "ttft_p99_s", "latency_avg_s", "latency_p50_s", "latency_p90_s", "latency_p99_s",
            "duration_s", "throughput_rps", "input_tokens_per_s", "output_tokens_per_s", "tokens_per_s",
            "prefill_s_per_token", "forward_s_per_token", "contention_factor", "ttft_served_avg_s", "ttft_floor_avg_s",
            "ttft_vs_floor", "throughput_at_floor_rps",
            "store_cpu_s", "store_cpu_s_per_page", "load_s_per_token", "bytes_by_tier", "paths", "evicted_pages",
            "cache_stats")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_ideal_hit_rate_of_a_known_workload():
    w = Workload(num_clients=2, num_rounds=3, request_length=20, output_length=5)
    # prompts 20, 45, 70 tokens; the cache holds the previous prompt and 4 fed reply tokens, in whole
    # 8-token pages: round 1 finds 24 of 24, round 2 finds 48 of 49
    assert [w.prompt_tokens(r) for r in range(3)] == [20, 45, 70]
    assert ideal_cached_tokens(45, (20, 5), 8) == 24
    assert ideal_cached_tokens(70, (45, 5), 8) == 48
    assert w.ideal_hit_rate(8) == pytest.approx((24 + 48) / (20 + 45 + 70))
    # the prompt's last token is never matched; page size 1 is the token-exact cache
    assert ideal_cached_tokens(16, (10, 6), 16) == 0
    assert w.ideal_hit_rate(1) == pytest.approx((24 + 49) / 135)


def test_the_driver_keeps_each_client_in_order_and_the_flight_bounded():
    w = Workload(num_clients=5, num_rounds=4, request_length=7, output_length=2, max_parallel=3,
                 request_rate=math.inf, seed=3)
    lock, in_flight, peak, seen = threading.Lock(), [0], [0], []

    def send(client, round_index, conversation):
        assert len(conversation.questions) == round_index + 1 == len(conversation.replies) + 1
        assert all(len(q) == 7 for q in conversation.questions)
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            seen.append((client, round_index))
        time.sleep(0.002)
        with lock:
            in_flight[0] -= 1
        return Reply(text="ab", output_ids=(1, 2), prompt_tokens=w.prompt_tokens(round_index), completion_tokens=2,
                     cached_tokens=0, tier_tokens=None, ttft_s=0.001, latency_s=0.002)

    result = drive(w, send)
    assert len(result.records) == w.num_requests and sorted(seen) == sorted(set(seen))
    assert 1 < peak[0] <= 3
    for client in range(5):
        assert [r.round_index for r in result.records if r.client == client] == [0, 1, 2, 3]
    assert w.questions() == Workload(num_clients=5, num_rounds=4, request_length=7, seed=3).questions()
    assert w.questions() != Workload(num_clients=5, num_rounds=4, request_length=7, seed=4).questions()


def test_a_failed_request_stops_the_run_with_its_client_and_round():
    def send(client, round_index, conversation):
        raise OSError("connection reset")

    with pytest.raises(RuntimeError, match=r"client \d round 0: OSError: connection reset"):
        drive(Workload(num_clients=2, num_rounds=2, max_parallel=2, request_rate=math.inf), send)


def test_budgets_are_a_quarter_of_the_histories_with_a_device_floor():
    identity = ModelIdentity("m", "float32", num_layers=2, num_kv_heads=1, head_dim=8, page_size=16)
    layout = KVLayout.from_identity(identity)
    w = Workload(num_clients=40, num_rounds=4, request_length=60, output_length=4)  # 16 pages a client
    b = bench.Budgets.derive(w, 16, 1, layout, None, None)
    assert (b.history_pages, b.device_pages, b.host_pages) == (640, 54, 106) and b.is_derived
    assert b.memory_share == pytest.approx(0.25, abs=0.01)
    few = bench.Budgets.derive(Workload(num_clients=4, num_rounds=4, request_length=60, output_length=4),
                               16, 2, layout, None, None)
    assert few.device_pages == 3 * 16 and few.host_pages == few.device_pages  # the floor, then host >= device
    given = bench.Budgets.derive(w, 16, 1, layout, "10pages", f"{20 * layout.page_size_bytes}B")
    assert (given.device_pages, given.host_pages, given.is_derived) == (10, 20, False)
    with pytest.raises(ValueError, match="smaller than the device pool"):
        bench.Budgets.derive(w, 16, 1, layout, "10pages", "5pages")


def test_a_tiny_run_reports_every_key(tmp_path, capsys):
    out, png = tmp_path / "multiturn.json", tmp_path / "multiturn.png"
    assert bench.run(parse([*TINY, "--output", str(out), "--plot", str(png)])) == 0
    doc = json.loads(out.read_text())
    runs = {r["name"]: r for r in doc["runs"]}
    assert list(runs) == ["no-cache", "device", "device+host", "device+host+disk", "disk-restart"]
    w = Workload(num_clients=CLIENTS, num_rounds=ROUNDS, request_length=QUESTION, output_length=OUTPUT)
    prompt_tokens = CLIENTS * sum(w.prompt_tokens(r) for r in range(ROUNDS))
    for name, r in runs.items():
        for key in RUN_KEYS:
            assert key in r, (name, key)
        assert r["num_requests"] == CLIENTS * ROUNDS and r["prompt_tokens"] == prompt_tokens
        assert r["completion_tokens"] == CLIENTS * ROUNDS * OUTPUT  # ignore_eos: every reply is full length
        assert 0.0 <= r["hit_rate"] <= 1.0 and r["cached_tokens"] == pytest.approx(r["hit_rate"] * prompt_tokens)
        assert sum(r["hit_rate_by_tier"].values()) == pytest.approx(r["hit_rate"])
        assert r["ideal_hit_rate"] == pytest.approx(w.ideal_hit_rate(PAGE))  # lengths are exact in-process
        for key in ("ttft_avg_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "latency_avg_s", "throughput_rps",
                    "input_tokens_per_s", "output_tokens_per_s", "tokens_per_s", "duration_s"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (name, key)
        assert r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"] and r["ttft_avg_s"] <= r["latency_avg_s"]
        assert set(r["bytes_by_tier"]) == {"device", "host", "disk"}
        assert set(r["paths"]) == {"device_to_host", "host_to_disk", "disk_to_host", "host_to_device"}
    assert runs["no-cache"]["hit_rate"] == 0.0 and runs["no-cache"]["prefill_s_per_token"] > 0
    for name in ("no-cache", "device"):  # nothing leaves the device pool
        assert all(v == 0 for tier in runs[name]["bytes_by_tier"].values() for v in tier.values())
    assert runs["device+host"]["bytes_by_tier"]["host"]["written"] > 0
    assert runs["device+host"]["bytes_by_tier"]["disk"] == {"read": 0, "written": 0}
    disk, restart = runs["device+host+disk"], runs["disk-restart"]
    assert disk["bytes_by_tier"]["disk"]["written"] > 0 and restart["bytes_by_tier"]["disk"]["read"] > 0
    assert 0 < disk["hit_rate"] <= disk["ideal_hit_rate"] + 1e-9  # nothing beats an infinite cache from cold
    assert disk["hit_rate"] >= runs["device+host"]["hit_rate"]
    assert restart["hit_rate"] >= runs["device+host"]["hit_rate"] and restart["hit_rate_by_tier"]["disk"] > 0
    assert restart["cold_method"] in ("drop_caches", "fadvise_dontneed", "none")
    assert set(doc["targets"]) == {"disk_hit_rate_vs_ideal", "disk_throughput_vs_device_host",
                                   "disk_ttft_avg_vs_device_host", "restart_hit_rate_vs_disk",
                                   "disk_contention_factor", "disk_ttft_vs_floor"}
    # The forward's figures: measured in every run, against the no-cache run's fit.
    for name, r in runs.items():
        assert r["forward_s_per_token"] > 0 and r["contention_factor"] > 0, name
        assert (r["ttft_floor_avg_s"] or 0) > 0 and r["ttft_vs_floor"] > 0, name
        assert r["throughput_at_floor_rps"] > 0, name
    assert set(doc["bounds"]) == {"disk_throughput_vs_device_host_at_floor"}
    assert doc["bounds"]["disk_throughput_vs_device_host_at_floor"] == pytest.approx(
        disk["throughput_at_floor_rps"] / runs["device+host"]["throughput_at_floor_rps"])
    assert runs["no-cache"]["contention_factor"] == pytest.approx(1.0, abs=0.35)  # its own fit
    # The store's threads did the disk's work: writes in the first disk run, loads in the replay.
    assert disk["store_cpu_s"]["write"] > 0 and restart["store_cpu_s"]["load"] > 0
    assert disk["store_cpu_s_per_page"]["written"] > 0 and restart["store_cpu_s_per_page"]["loaded"] > 0
    assert runs["device+host"]["store_cpu_s"] is None
    assert doc["workload"]["num_clients"] == CLIENTS and doc["budgets"]["page_size"] == PAGE
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert "device+host+disk" in table and "ideal hit rate" in table and "TTFT P90" in table


def test_configs_choose_what_runs(tmp_path):
    out = tmp_path / "m.json"
    assert bench.run(parse([*TINY, "--num-clients", "2", "--configs", "device", "--output", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["runs"]] == ["device"] and doc["targets"] == {}


def test_seal_key_runs_the_disk_configurations_on_a_sealed_store(tmp_path):
    from chunkstore import ChunkStore
    from chunkstore.disk import FileKeyProvider, SealKeyError, read_identity, write_key_file

    write_key_file(tmp_path / "seal.key")
    out, keep = tmp_path / "m.json", tmp_path / "keep"
    assert bench.run(parse([*TINY, "--num-clients", "2", "--configs", "device+host+disk", "--seal-key",
                            str(tmp_path / "seal.key"), "--keep", str(keep), "--output", str(out)])) == 0
    doc = json.loads(out.read_text())
    assert doc["sealed"] and doc["runs"][0]["hit_rate"] > 0
    folder = next(p.parent for p in keep.rglob("store.json"))
    with pytest.raises(SealKeyError):  # what it wrote is sealed
        ChunkStore(folder, read_identity(folder), read_only=True)
    with ChunkStore(folder, read_identity(folder), read_only=True,
                    seal_key=FileKeyProvider(tmp_path / "seal.key")) as store:
        assert store.is_sealed and store.num_chunks() > 0


# ---- --url against a stand-in OpenAI server ----------------------------------------------------------

class _FakeServer(BaseHTTPRequestHandler):
    """Streams chat completions (chunked, as uvicorn does) from an infinite per-user prefix cache of
    16-byte pages over the byte chat template, holding each prompt plus its reply but the last byte."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[dict, dict]]] = []  # reset by the fixture
    stored: ClassVar[dict[str, list[str]]] = {}

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/get_model_info":  # what chunkstore serve answers (SGLang's fields and its own)
            self._json(200, {"model_path": "stand-in", "served_model_name": "stand-in", "page_size": 16,
                             "model_id": "stand-in:w=0", "max_positions": 4096})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((payload, dict(self.headers)))
        prompt = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in payload["messages"]) + "<|assistant|>\n"
        history = self.stored.setdefault(payload["user"], [])
        common = max((len(_common_prefix(prompt[:-1], h)) for h in history), default=0)
        cached = common // 16 * 16
        reply = "xyz"[: payload["max_tokens"]].ljust(payload["max_tokens"], "w")
        history.append(prompt + reply[:-1])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        events += [{"choices": [{"index": 0, "delta": {"content": ch}}]} for ch in reply]
        events.append({"choices": [], "usage": {
            "prompt_tokens": len(prompt), "completion_tokens": len(reply), "total_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": cached},
            "cached_tokens_details": {"device": cached, "host": 0, "disk": 0}}})
        for data in [*(json.dumps(e) for e in events), "[DONE]"]:
            chunk = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@pytest.fixture
def fake_server():
    _FakeServer.seen, _FakeServer.stored = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_url_mode_streams_chats_and_reads_the_cached_tokens(fake_server, tmp_path):
    out = tmp_path / "url.json"
    argv = ["--url", fake_server, "--api-key", "sekrit", "--configs", "no-cache,server", "--num-clients", "3",
            "--num-rounds", "3", "--request-length", "30", "--output-length", "3", "--page-size", "16",
            "--request-rate", "inf", "--no-progress", "--output", str(out)]
    assert bench.run(parse(argv)) == 0
    doc = json.loads(out.read_text())
    runs = {r["name"]: r for r in doc["runs"]}
    assert list(runs) == ["no-cache", "server"] and doc["mode"] == "url"
    server = runs["server"]
    assert runs["no-cache"]["hit_rate"] == 0.0
    assert 0 < server["hit_rate"] == pytest.approx(server["ideal_hit_rate"])  # the stand-in is an ideal cache
    assert server["hit_rate_by_tier"]["device"] == pytest.approx(server["hit_rate"])
    assert server["bytes_by_tier"] is None and server["prefill_s_per_token"] is None
    assert server["completion_tokens"] == 3 * 3 * 3 and 0 < server["ttft_avg_s"] <= server["latency_avg_s"]
    payloads = [p for p, _ in _FakeServer.seen]
    assert all(p["stream"] and p["ignore_eos"] and p["max_tokens"] == 3 and p["temperature"] == 0 for p in payloads)
    assert all(h["Authorization"] == "Bearer sekrit" for _, h in _FakeServer.seen)
    last = max(payloads, key=lambda p: len(p["messages"]))
    assert [m["role"] for m in last["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert last["messages"][1]["content"] == "xyz"
    assert len({p["user"] for p in payloads[:9]}) == 9  # no-cache: a fresh namespace per request
    assert len({p["user"] for p in payloads[9:]}) == 1


def test_url_mode_reads_the_page_size_and_model_from_the_server(fake_server, tmp_path, capsys):
    out = tmp_path / "url.json"
    argv = ["--url", fake_server, "--num-clients", "2", "--num-rounds", "2", "--request-length", "30",
            "--output-length", "3", "--request-rate", "inf", "--no-progress", "--output", str(out)]
    assert bench.run(parse(argv)) == 0  # no --page-size: the server's 16, not an assumed 64
    doc = json.loads(out.read_text())
    assert doc["budgets"]["page_size"] == 16 and doc["model"]["name"] == "stand-in"
    assert doc["model"]["model_id"] == "stand-in:w=0" and "16-token pages" in doc["header"]
    assert {p["model"] for p, _ in _FakeServer.seen} == {"stand-in"}
    server = doc["runs"][0]
    assert 0 < server["hit_rate"] == pytest.approx(server["ideal_hit_rate"])  # the ideal at the server's pages
    assert bench.run(parse([*argv, "--page-size", "64"])) == 2
    err = capsys.readouterr().err
    assert "--page-size 64 disagrees with the server's page size 16" in err


def test_defaults_follow_sglangs_bench_multiturn_or_say_why_not():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([])
    sglang = bench.SGLANG_DEFAULTS
    helps = {a.dest: a.help for a in parser._actions}
    for name in ("num_clients", "num_rounds", "request_length", "output_length", "max_parallel", "request_rate",
                 "seed"):
        ours = getattr(args, name)
        if ours == sglang[name]:
            continue
        assert f"SGLang's {sglang[name]:g}" in helps[name] or "SGLang's sweep" in helps[name], name
    assert (args.num_rounds, args.seed) == (sglang["num_rounds"], sglang["seed"])


def test_an_unreachable_server_is_a_clear_failure(capsys):
    argv = ["--url", "http://127.0.0.1:9", "--num-clients", "1", "--num-rounds", "1", "--no-progress"]
    assert bench.run(parse(argv)) == 1
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--num-clients", "0"], "num_clients must be an integer >= 1"),
    (["--request-rate", "0"], "request_rate must be > 0"),
    (["--configs", "device,bogus"], "unknown configuration 'bogus'; valid: no-cache, device"),
    (["--configs", "disk-restart"], "disk-restart replays over the disk tier device+host+disk leaves"),
    (["--configs", "server"], "server runs only with --url"),
    (["--url", "http://127.0.0.1:9", "--configs", "device"], "with --url only no-cache and server run"),
    (["--url", "ftp://x"], "--url must look like http://"),
    (["--num-rounds", "40", "--request-length", "200"], "the model allows 4096"),
    (["--preset", "huge"], "unknown preset 'huge'; presets: tiny, small, llama-1b"),
    (["--model", "/no/such/model"], "--model /no/such/model: no such folder"),
    (["--dtype", "int3"], "unknown dtype 'int3'"),
    (["--device-size", "12 parsecs"], "not a size: '12 parsecs'"),
    (["--page-size", "0"], "--page-size must be >= 1"),
    (["--max-running", "0"], "--max-running must be >= 1"),
    (["--output", "/no/such/folder/x.json"], "--output /no/such/folder/x.json: folder /no/such/folder does not exist"),
    (["--plot", "/no/such/folder/x.png"], "does not exist"),
    (["--device-size", "20pages", "--host-size", "10pages"], "smaller than the device pool"),
])
def test_bad_options_are_refused(argv, message, capsys):
    assert bench.run(parse([*TINY, *argv])) == 2
    err = capsys.readouterr().err
    assert "chunkstore bench multiturn: error:" in err and message in err


def test_keep_refuses_a_folder_with_files(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    assert bench.run(parse([*TINY, "--keep", str(tmp_path)])) == 2
    assert "not a new or empty folder" in capsys.readouterr().err


def test_disk_size_takes_gb_or_a_size_as_every_command_does():
    assert bench.config_from_args(parse(["--disk-size", "500MB"])).disk_size_gb == 0.5
    assert bench.config_from_args(parse(["--disk-size", "2"])).disk_size_gb == 2.0
    for bad in ("lots", "-1", "0"):
        with pytest.raises(SystemExit):
            parse(["--disk-size", bad])
