"""The stats history of each server on a shared tier (one PostgreSQL index, one bucket on moto's S3
server, several servers' `chunkstore admin` backends each from its own folder): every sample carries
its server's key, so each server reads only its own history, one server's trim keeps the others'
rows, a restart from the same folder continues the same history, the rows written before the key
existed go to the first server that samples, and a rebuild carries every server's history over.
A store of its own (SQLite) keeps the key '' and its whole history."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, func, insert, select

from chunkstore.api import StoreBackend, create_app
from chunkstore.api.history import server_key
from chunkstore.api.history_schema import stats_history
from tests.api.shared_tier import Tier, fill_tier
from tests.helpers.api import client, live_server, settings, wait_for


@pytest.fixture
def tier(tmp_path, moto_s3, bucket_url, postgres_url) -> Tier:
    return Tier(postgres_url, bucket_url, moto_s3, tmp_path)


@contextlib.contextmanager
def server(tier: Tier, name: str, max_rows: int = 3) -> Iterator[tuple[StoreBackend, object, str]]:
    """Server ``name``'s API over the tier from its own folder: (backend, app, url). Samples are
    taken with ``app.state.admin.sampler.sample_now()`` only (the timer's first is an hour away)."""
    backend = tier.backend(name)
    try:
        app = create_app(backend, settings(history_max_rows=max_rows, history_interval_s=3600))
        with live_server(app) as url:
            yield backend, app, url
    finally:
        backend.close()


def sample(app, n: int) -> None:
    for _ in range(n):
        assert app.state.admin.sampler.sample_now()


def history(url: str) -> dict:
    with client(url) as c:
        got = c.get("/stats/history", params={"limit": 100})
    assert got.status_code == 200, got.text
    return got.json()


def rows_per_server(tier: Tier) -> dict[str, int]:
    engine = create_engine(tier.index_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(select(stats_history.c.server, func.count()).group_by(stats_history.c.server))
            return {key: n for key, n in found}
    finally:
        engine.dispose()


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_each_server_reads_and_trims_only_its_own_history(tier):
    with server(tier, "server-a") as (a, app_a, url_a), server(tier, "server-b") as (b, app_b, url_b):
        with a.using_store() as store_a, b.using_store() as store_b:
            key_a, key_b = server_key(store_a), server_key(store_b)
        assert key_a and key_b and key_a != key_b and key_a.endswith(str(tier.root.resolve() / "server-a"))
        sample(app_b, 2)
        sample(app_a, 5)  # a's trim to its newest 3: b's two older rows, lower ids, stay
        sample(app_b, 1)
        ha, hb = history(url_a), history(url_b)
        assert (ha["server"], hb["server"]) == (key_a, key_b)
        assert ha["is_recording"] and hb["is_recording"]
        assert len(ha["samples"]) == 3 and len(hb["samples"]) == 3
        assert not {s["sampled_at"] for s in ha["samples"]} & {s["sampled_at"] for s in hb["samples"]}
        assert rows_per_server(tier) == {key_a: 3, key_b: 3}
        sample(app_b, 4)  # now b trims: a's rows stay
        assert rows_per_server(tier) == {key_a: 3, key_b: 3}
        assert history(url_a)["samples"] == ha["samples"]
        assert history(url_b)["samples"][-1]["sampled_at"] > hb["samples"][-1]["sampled_at"]
    # A restart from the same folder is the same server: its history goes on where it stopped.
    with server(tier, "server-a") as (_, app_a, url_a):
        before = [s["sampled_at"] for s in ha["samples"]]
        assert [s["sampled_at"] for s in history(url_a)["samples"]] == before
        sample(app_a, 1)
        after = [s["sampled_at"] for s in history(url_a)["samples"]]
        assert after[:2] == before[1:] and after[2] > before[-1]
    assert rows_per_server(tier) == {key_a: 3, key_b: 3}


def test_the_first_server_to_sample_adopts_the_rows_from_before_the_key(tier):
    with server(tier, "server-a", max_rows=4) as (a, app_a, url_a), server(tier, "server-b") as (b, app_b, url_b):
        # What the API's migration leaves of the rows written before the key: every one under ''.
        engine = create_engine(tier.index_url)
        try:
            with engine.begin() as conn:
                conn.execute(insert(stats_history), [{"sampled_at": float(t), "uptime_s": float(t)} for t in (1, 2, 3)])
        finally:
            engine.dispose()
        assert rows_per_server(tier) == {"": 3}
        assert history(url_a)["samples"] == history(url_b)["samples"] == []  # nobody's yet
        sample(app_a, 2)
        sample(app_b, 1)
        with a.using_store() as store_a, b.using_store() as store_b:
            key_a, key_b = server_key(store_a), server_key(store_b)
        assert rows_per_server(tier) == {key_a: 4, key_b: 1}  # a took them, then trimmed to its 4
        assert [s["sampled_at"] for s in history(url_a)["samples"]][:2] == [2.0, 3.0]
        assert len(history(url_b)["samples"]) == 1


def test_a_rebuild_of_the_tier_carries_every_servers_history_over(tier):
    fill_tier(tier)  # the bucket holds objects to index again
    with server(tier, "server-b") as (_, app_b, url_b):
        sample(app_b, 2)
        kept_b = history(url_b)["samples"]
    with server(tier, "server-a") as (_, app_a, url_a):  # b is stopped: a rebuild drops the tier's tables
        sample(app_a, 1)
        kept_a = history(url_a)["samples"]
        with client(url_a) as c:
            job = c.post("/jobs/rebuild").json()
            done = wait_for(lambda: (j := c.get(f"/jobs/{job['id']}").json())["state"] != "running" and j,
                            what="the rebuild")
        assert done["state"] == "succeeded", done
        assert history(url_a)["samples"] == kept_a
    with server(tier, "server-b") as (_, _, url_b):
        assert history(url_b)["samples"] == kept_b


def test_a_store_of_its_own_keeps_the_key_and_its_whole_history(tmp_path):
    from tests.helpers.api import fill_store

    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        app = create_app(backend, settings(history_max_rows=3, history_interval_s=3600))
        with backend.using_store() as store:
            assert server_key(store) == "" and not store.shared
            engine = create_engine(store.index_url)  # rows from before the key existed have the key '' too
            with engine.begin() as conn:
                conn.execute(insert(stats_history).values(sampled_at=1.0, uptime_s=1.0))
            engine.dispose()
            assert [r["sampled_at"] for r in app.state.admin.history.read(store)] == [1.0]
        sample(app, 2)
        with backend.using_store() as store:
            rows = app.state.admin.history.read(store)
            assert len(rows) == 3 and rows[0]["sampled_at"] == 1.0
            sample(app, 1)
            rows = app.state.admin.history.read(store, every_server=True)
            assert len(rows) == 3 and {r["server"] for r in rows} == {""} and rows[0]["sampled_at"] != 1.0
    finally:
        backend.close()
