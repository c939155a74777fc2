"""Several `chunkstore serve` processes on one shared tier (the index on a real PostgreSQL server,
the payloads in an S3 bucket: Ceph's RADOS Gateway where it is installed, as in CI, else moto's
server), each with its own data folder: a prompt sent to one is a hit on another with the same
greedy output, also after every server restarts; tenants stay apart across servers; a writer
killed with SIGKILL leaves nothing another reads wrong; a database that stops is a miss, never an
error to a client, and the servers recover when it returns."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from sqlalchemy import create_engine, text

from chunkstore import ChunkStore
from chunkstore.disk.maintenance import verify
from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig
from chunkstore.disk.store_folder import read_identity
from tests.helpers.server import PAGE_SIZE, STORY, ServeProcess

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset

GREEDY = {"max_tokens": 16, "temperature": 0}


def complete(server: ServeProcess, prompt: str, namespace: str | None = None) -> dict:
    headers = {"X-Chunkstore-Namespace": namespace} if namespace else {}
    reply = server.client.post("/v1/completions", json={"prompt": prompt, **GREEDY}, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> dict:
    usage = reply["usage"]
    return {"total": usage["prompt_tokens_details"]["cached_tokens"], **usage["cached_tokens_details"]}


def fed_pages(reply: dict) -> int:
    usage = reply["usage"]
    return (usage["prompt_tokens"] + usage["completion_tokens"] - 1) // PAGE_SIZE


class Fleet:
    """Servers on one shared tier; ``start(name)`` runs `chunkstore serve` over ``<tmp>/<name>``."""

    def __init__(self, tmp_path, index_url: str, bucket_url: str, s3_env: dict[str, str]) -> None:
        self.tmp_path, self.index_url, self.bucket_url, self.s3_env = tmp_path, index_url, bucket_url, s3_env
        self.started: list[ServeProcess] = []
        self._engine = create_engine(index_url)

    def start(self, name: str, *flags: str) -> ServeProcess:
        proc = ServeProcess(self.tmp_path / name, self.tmp_path / f"{name}-{len(self.started)}.log",
                            "--index-url", self.index_url, "--object-store", self.bucket_url, *flags, env=self.s3_env)
        self.started.append(proc)
        return proc

    def rows(self) -> int:
        with self._engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM chunks")).scalar()

    def wait_for_rows(self, at_least: int, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while (n := self.rows()) < at_least:
            assert time.monotonic() < deadline, f"{n} rows on the shared tier after {timeout_s} s, expected {at_least}"
            time.sleep(0.1)
        return n

    def open_store(self, name: str) -> ChunkStore:
        """Server ``name``'s store, opened read-only beside it."""
        folder = self.tmp_path / name
        config = ObjectStoreConfig(self.bucket_url, endpoint_url=self.s3_env["AWS_ENDPOINT_URL"],
                                   region=self.s3_env["AWS_REGION"], access_key_id=self.s3_env["AWS_ACCESS_KEY_ID"],
                                   secret_access_key=self.s3_env["AWS_SECRET_ACCESS_KEY"])
        return ChunkStore(folder, read_identity(folder), read_only=True, index_url=self.index_url,
                          payloads=ObjectPayloads(config))

    def dispose(self) -> None:
        self._engine.dispose()

    def close(self) -> None:
        for proc in self.started:
            proc.stop()
        self.dispose()


@pytest.fixture
def fleet(tmp_path, postgres_url, shared_s3) -> Fleet:
    bucket = f"fleet-{uuid.uuid4().hex[:12]}"
    shared_s3.create_bucket(bucket)
    f = Fleet(tmp_path, postgres_url, f"s3://{bucket}/tiny", shared_s3.aws_env())
    yield f
    f.close()


def test_a_prompt_sent_to_one_server_is_a_hit_on_another_also_after_restarts(fleet):
    prompt = "the shared system prompt: " + STORY * 2
    a, b = fleet.start("a"), fleet.start("b")
    first = complete(a, prompt)
    assert cached(first)["total"] == 0
    fleet.wait_for_rows(fed_pages(first))
    on_b = complete(b, prompt)
    assert on_b["choices"][0]["text"] == first["choices"][0]["text"]  # greedy: the same output
    assert cached(on_b)["disk"] == cached(on_b)["total"] > 0  # from the shared tier
    disk = b.client.get("/api/v1/stats").json()["disk"]  # the management API shows the tier
    assert disk["num_chunks"] == fleet.rows() and disk["shared_tier"]["payload_store"] == fleet.bucket_url
    for proc in (a, b):
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    c = fleet.start("c")  # a third server, new after every restart
    again = complete(c, prompt)
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert cached(again)["disk"] == cached(on_b)["total"]


def test_tenants_stay_apart_across_servers(fleet):
    prompt = "alice's private notes: " + STORY * 2
    a, b = fleet.start("a"), fleet.start("b")
    mine = complete(a, prompt, "alice")
    fleet.wait_for_rows(fed_pages(mine))
    for other in ("bob", None):
        assert cached(complete(b, prompt, other))["total"] == 0
    assert cached(complete(b, prompt, "alice"))["disk"] > 0


def test_a_server_killed_while_it_publishes_leaves_nothing_partial(fleet):
    a = fleet.start("a")
    prompts = [f"document {i}: " + STORY * 3 for i in range(6)]
    texts = [complete(a, p)["choices"][0]["text"] for p in prompts]
    a.signal(signal.SIGKILL)  # write-through still publishing in the background
    assert a.wait() == -signal.SIGKILL
    b = fleet.start("b")
    with fleet.open_store("b") as store:
        report = verify(store)
        assert report.ok == store.num_chunks() > 0 and report.corrupt == report.missing == 0
    assert [complete(b, p)["choices"][0]["text"] for p in prompts] == texts  # hits as far as published


def test_a_stopped_database_is_a_miss_not_an_error_and_the_servers_recover(tmp_path, restartable_postgres,
                                                                            shared_s3):
    bucket = f"outage-{uuid.uuid4().hex[:12]}"
    shared_s3.create_bucket(bucket)
    fleet = Fleet(tmp_path, restartable_postgres.create_database("fleet"), f"s3://{bucket}/tiny", shared_s3.aws_env())
    try:
        prompt = "before the outage: " + STORY * 2
        a, b = fleet.start("a"), fleet.start("b")
        first = complete(a, prompt)
        fleet.wait_for_rows(fed_pages(first))
        fleet.dispose()
        restartable_postgres.stop()
        during = complete(b, prompt)  # 200, computed: the shared tier misses
        assert during["choices"][0]["text"] == first["choices"][0]["text"] and cached(during)["disk"] == 0
        assert complete(a, "written during the outage: " + STORY)["choices"][0]["text"]
        restartable_postgres.start()
        later = complete(a, "after the outage: " + STORY * 2)
        fleet.wait_for_rows(fed_pages(first) + fed_pages(later))  # a publishes again
        c = fleet.start("c")
        after = complete(c, prompt)
        assert cached(after)["disk"] > 0 and after["choices"][0]["text"] == first["choices"][0]["text"]
        assert "index lookup" in b.output() and "reads of the store" in b.output()  # logged, not raised
    finally:
        fleet.close()


def test_a_stopped_object_store_is_a_miss_not_an_error_and_the_servers_recover(fleet, shared_s3):
    if not hasattr(shared_s3, "stop_gateway"):
        pytest.skip("needs radosgw (a gateway stopped and started again over the same data)")
    prompt = "before the gateway stops: " + STORY * 2
    a, b = fleet.start("a"), fleet.start("b")
    first = complete(a, prompt)
    fleet.wait_for_rows(fed_pages(first))
    rows = fleet.rows()
    shared_s3.stop_gateway()
    try:
        during = complete(b, prompt)  # the rows say the pages are there; their objects do not answer
        assert during["choices"][0]["text"] == first["choices"][0]["text"] and cached(during)["disk"] == 0
        complete(a, "written while the gateway is down: " + STORY)  # its puts fail and leave no row
        assert fleet.rows() == rows  # nothing dropped, nothing half-published
    finally:
        shared_s3.start_gateway()
    after = complete(fleet.start("c"), prompt)
    assert cached(after)["disk"] > 0 and after["choices"][0]["text"] == first["choices"][0]["text"]
    assert "unavailable" in b.output()  # logged, not raised


def test_a_server_reads_what_it_read_before_from_its_local_copy_even_with_the_gateway_down(fleet, shared_s3):
    if not hasattr(shared_s3, "stop_gateway"):
        pytest.skip("needs radosgw (a gateway stopped and started again over the same data)")
    prompt = "read once over the network: " + STORY * 2
    a, b = fleet.start("a"), fleet.start("b")
    first = complete(a, prompt)
    fleet.wait_for_rows(fed_pages(first))
    assert cached(complete(b, prompt))["disk"] > 0  # from the bucket, and now in b's local copy
    b.signal(signal.SIGTERM)
    assert b.wait() == 0
    b = fleet.start("b")  # empty memory tiers, the same folder (a server starts with its bucket up)
    shared_s3.stop_gateway()
    try:
        again = complete(b, prompt)
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        assert cached(again)["disk"] > 0  # the rows say the pages are there; the local copy serves them
        copy = b.client.get("/api/v1/stats").json()["disk"]["shared_tier"]["local_copy"]
        assert copy["hits"] > 0 and copy["misses"] == 0 and copy["entries"] > 0
    finally:
        shared_s3.start_gateway()
