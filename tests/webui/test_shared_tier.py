"""The overview's shared tier in a real browser, over the management API of a real shared tier (an
index on PostgreSQL, a bucket on moto's S3 server) served by uvicorn on 127.0.0.1: the bucket, the
database, this server's names, the claims held and lapsed, the read health and every server's row
(hits, misses, hit rate, published, last seen; this one first, a dead one stale), following the live
figures as another server reads; hidden on a store of its own."""

from __future__ import annotations

import pytest

from chunkstore.api import AdminSettings, create_app
from chunkstore.disk.index import display_url
from tests.api.shared_tier import Tier, add_gone_server, add_lapsed_claim, fill_tier, pages_of
from tests.helpers.server import LiveServer
from tests.helpers.webui import SHOTS, TOKEN, Dashboard


@pytest.fixture
def tier(tmp_path, moto_s3, bucket_url, postgres_url) -> Tier:
    return Tier(postgres_url, bucket_url, moto_s3, tmp_path)


def _cells(page, server: str) -> dict[str, str]:
    """The row of ``server`` in the servers' table, by column."""
    return page.evaluate("""server => {
        const row = document.querySelector(`#shared-servers tbody tr[data-server="${server}"]`);
        return Object.fromEntries([...row.cells].map((td) => [td.dataset.label, td.textContent]));
    }""", server)


def _figures(page) -> dict[str, str]:
    """The shared tier's figures, term -> value."""
    return page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#shared-figures dt')]
        .map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))""")


def test_the_overview_shows_the_shared_tier_and_its_servers(browser, tier):
    pages, _ = fill_tier(tier)
    add_gone_server(tier)
    add_lapsed_claim(tier, pages_of(1, offset=90)[0].key)
    backend = tier.backend()
    try:
        with LiveServer(create_app(backend, AdminSettings(token=TOKEN, events_interval_s=0.2))) as live:
            shared = backend.snapshot().store.shared
            for width, height in ((1280, 900), (390, 844)):
                d = Dashboard(browser, live.url, width, height).open("overview")
                try:
                    page = d.page
                    page.wait_for_selector("#shared-tier:not([hidden]) #shared-servers tbody tr")
                    f = _figures(page)
                    assert (f["Bucket"], f["Database"]) == (tier.bucket_url, display_url(tier.index_url))
                    assert (f["This server"], f["Writer id"]) == (shared.server_name, shared.writer_id)
                    assert (f["Publish claims"], f["Read health"]) == ("1 held, 1 lapsed", "OK")
                    assert f["Evictor lock"].startswith("not taken by this server")
                    assert f["Room lock"].startswith("not taken by this server")
                    assert f["Bucket objects"].startswith("not listed yet: a gc job")
                    assert f["Tier"].startswith("8 chunks, ")  # the whole tier's rows
                    assert page.is_visible("#shared-claims-note") and "gc job" in page.inner_text("#shared-claims-note")
                    assert page.is_hidden("#shared-read-warning")
                    states = page.eval_on_selector_all("#shared-servers tbody tr",
                                                       "rows => rows.map((r) => [r.dataset.server, r.dataset.state])")
                    assert states[0] == [shared.server_name, "self"]  # this server first
                    assert dict(states)["server-a"] == dict(states)["server-b"] == "live"
                    assert dict(states)["gone:1"] == "stale" and states[-1][0] == "gone:1"
                    a, b, gone = _cells(page, "server-a"), _cells(page, "server-b"), _cells(page, "gone:1")
                    assert (a["hits"], a["misses"], a["hit rate"], a["published"]) == ("6", "0", "100.0 %", "6")
                    assert (b["hits"], b["misses"], b["hit rate"], b["published"]) == ("3", "2", "60.0 %", "2")
                    assert b["dedup hits"] == "1" and "ago" in b["last seen"]
                    assert gone["state"] == "stale" and gone["hit rate"] == "50.0 %" and "min ago" in gone["last seen"]
                    SHOTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SHOTS / f"shared-tier-{width}.png"), full_page=True)
                    assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
                    assert not d.errors, d.errors
                finally:
                    d.close()
            # The live figures: server b reads again; once its counts are written the row follows.
            d = Dashboard(browser, live.url).open("overview")
            try:
                page = d.page
                page.wait_for_selector("#shared-servers tbody tr[data-server=server-b]")
                with tier.store("server-b") as b:
                    assert all(t is not None for t in b.get(pages))
                page.wait_for_function("""() => {
                    const row = document.querySelector('#shared-servers tbody tr[data-server="server-b"]');
                    return row && row.cells[2].textContent === "9";
                }""")
                assert _cells(page, "server-b")["hit rate"] == "81.8 %"  # 9 of 11
                # A sweep on server a lists the bucket: the figure follows, for every server.
                with tier.store("server-a") as a:
                    a.sweep(grace_s=3600)  # (the lapsed claim's key has no object: nothing to delete)
                page.wait_for_function("""() => [...document.querySelectorAll('#shared-figures dt')]
                    .some((dt) => dt.textContent === "Bucket objects" && /by server-a/.test(dt.nextElementSibling.textContent))""")
                assert _figures(page)["Bucket objects"].startswith("8, as of ")  # one object per row
                assert not d.errors, d.errors
            finally:
                d.close()
    finally:
        backend.close()


def test_a_store_of_its_own_shows_no_shared_tier(browser, tmp_path):
    from chunkstore.api import StoreBackend
    from tests.helpers.api import fill_store

    fill_store(tmp_path / "store")
    backend = StoreBackend(tmp_path / "store")
    try:
        with LiveServer(create_app(backend, AdminSettings(token=TOKEN))) as live:
            d = Dashboard(browser, live.url).open("overview")
            try:
                d.page.wait_for_selector("#overview-tiers .tier[data-tier=disk]")
                assert d.page.is_hidden("#shared-tier")
                assert not d.errors, d.errors
            finally:
                d.close()
    finally:
        backend.close()
