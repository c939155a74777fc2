"""Several `chunkstore serve` processes on one shared tier (the index on a real PostgreSQL server,
the payloads in an S3 bucket: Ceph's RADOS Gateway where it is installed, as in CI, else moto's
server), each with its own data folder: a prompt sent to one is a hit on another with the same
greedy output, also after every server restarts; tenants stay apart across servers; a writer
killed with SIGKILL leaves nothing another reads wrong; a database that stops is a miss, never an
error to a client, and the servers recover when it returns."""

from __future__ import annotations

import signal
import uuid

import pytest

from chunkstore.disk.maintenance import verify
from tests.helpers.fleet import Fleet, cached, complete, fed_pages
from tests.helpers.server import STORY

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset


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
