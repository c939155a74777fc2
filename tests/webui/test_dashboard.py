"""The dashboard in a real browser against a real `chunkstore serve`: the overview's tiers and charts,
the chunk browser, an eviction (dry run, then confirmed), a verify job, a wrong token, and every view
at 1280 and 390 px wide without a console error (screenshots written to SHOTS for review)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from chunkstore.api import AdminSettings, StoreBackend, create_app
from chunkstore.engine import Engine
from chunkstore.serve import create_app as create_server_app
from chunkstore.server.lifecycle import bind
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import STORY, LiveServer, cache_config
from tests.helpers.webui import NAMESPACES, SHOTS, TOKEN, VIEWS, Traffic, send_traffic

ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def points(page, chart_id: str) -> int:
    return int(page.get_attribute(f"#{chart_id}", "data-points") or 0)


def wait_for_points(page, *chart_ids: str) -> None:
    selector = ", ".join(f"#{c}" for c in chart_ids)
    page.wait_for_function(f"""() => [...document.querySelectorAll({selector!r})]
        .every(el => Number(el.dataset.points || 0) > 0)""", timeout=30_000)


def test_overview_shows_the_tiers_and_live_charts(dashboard, server):
    d = dashboard().open("overview")
    page = d.page
    page.wait_for_selector("#overview-tiers .tier[data-tier=disk]")
    assert [t.get_attribute("data-tier") for t in page.query_selector_all("#overview-tiers .tier")] == \
        ["device", "host", "disk"]
    stats = server.client.get("/api/v1/stats").json()
    disk = page.get_attribute("#overview-tiers .tier[data-tier=disk]", "data-used-bytes")
    assert int(disk) > 0 and int(disk) <= stats["tiers"][2]["used_bytes"] * 2
    with Traffic(server):
        charts = ["chart-hit-rate", "chart-throughput", "chart-transfers"]
        if (stats.get("serving") or {}).get("ttft_count") is not None:
            charts.append("chart-ttft")  # serving figures (requests, TTFT) where the API reports them
        wait_for_points(page, *charts)
    page.wait_for_selector(".live[data-state=live]")
    assert "Hit rate" in page.inner_text("#overview-figures")
    assert not d.errors


def test_every_view_at_both_widths_without_console_errors(dashboard, server):
    """Before the tests below damage a chunk or clear the store: the screenshots show a healthy one."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 900), (390, 844)):
        d = dashboard(width, height).open("overview")
        with Traffic(server):
            wait_for_points(d.page, "chart-hit-rate", "chart-throughput")
            d.page.wait_for_timeout(1500)
        for view in VIEWS:
            d.go(view)
            ready = {"overview": "#overview-tiers .tier", "namespaces": "#namespaces-table table",
                     "chunks": "#chunk-list tbody tr", "controls": "#controls-usage [data-tier]",
                     "settings": "#config-form"}[view]
            d.page.wait_for_selector(ready)
            if view == "chunks":
                d.page.click("#chunk-list tbody tr:first-child button.key")
                d.page.wait_for_selector("#chunk-detail:not([hidden])")
            if view == "controls":  # the confirmation step of an eviction (a dry run changes nothing)
                d.page.click("#evict-form button[type=submit]")
                d.page.wait_for_selector("#evict-preview")
            d.page.wait_for_timeout(300)
            if view == "overview":  # the README's screenshot: a healthy store, every table in view
                assert d.page.locator("#view-overview .warning:visible").count() == 0
                assert d.page.evaluate("""[...document.querySelectorAll('#view-overview .table-wrap')]
                    .every(w => w.scrollWidth <= w.clientWidth + 1)"""), f"a table scrolls sideways at {width} px"
            d.page.screenshot(path=str(SHOTS / f"{view}-{width}.png"), full_page=True)
        assert not d.errors, d.errors
        assert d.page.evaluate("document.documentElement.scrollWidth") <= width + 1  # nothing wider than the screen
    dark = dashboard(1280, 900, color_scheme="dark").open("overview")
    with Traffic(server):
        wait_for_points(dark.page, "chart-hit-rate", "chart-throughput")
    dark.page.screenshot(path=str(SHOTS / "overview-1280-dark.png"), full_page=True)
    assert not dark.errors, dark.errors


def test_the_charts_are_full_from_the_history_alone(dashboard, server):
    """After a restart (or a reload) the charts come from GET /stats/history before any live sample."""
    for _ in range(2):
        send_traffic(server, rounds=1)
        time.sleep(1.2)  # history_interval_s is 0.5 here
    history = server.client.get("/api/v1/stats/history").json()
    assert history["is_recording"] and len(history["samples"]) >= 3
    d = dashboard().open("overview")
    wait_for_points(d.page, "chart-hit-rate", "chart-ttft")  # no traffic now: the points are the history's
    assert not d.errors


@contextlib.contextmanager
def serving_in_process(tiny, tmp_path, monkeypatch, history_interval_s: float) -> Iterator[str]:
    """The server's app run with its lifespan (so the history sampler runs) in a thread; its URL."""
    monkeypatch.setenv("CHUNKSTORE_ADMIN_HISTORY_INTERVAL_S", str(history_interval_s))
    engine = Engine(tiny, cache_config(tmp_path))
    sock = bind("127.0.0.1", 0)
    uv = uvicorn.Server(uvicorn.Config(create_server_app(engine, ServerSettings()), log_level="warning",
                                       lifespan="on", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not uv.started and time.monotonic() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(15)
        engine.close()


def test_the_charts_are_full_from_the_history_alone_with_the_sampler_running(dashboard, tiny, tmp_path, monkeypatch):
    """The same, over the server's app run with its lifespan (so the history sampler runs) in a thread."""
    with serving_in_process(tiny, tmp_path, monkeypatch, 0.3) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            for turn in range(3):
                for _ in range(2):
                    r = client.post("/v1/completions", json={"prompt": f"{STORY} {turn}", "max_tokens": 2})
                    assert r.status_code == 200, r.text
                time.sleep(0.8)
            history = client.get("/api/v1/stats/history").json()
        assert history["is_recording"] and len(history["samples"]) >= 3
        d = dashboard(url=url).open("overview", token=None)
        # The history loads beside the live stream, whose first sample may draw the charts first:
        # wait for the history itself, then for the points.
        d.page.wait_for_function("""() => (document.querySelector('#history-note')?.textContent || '')
            .includes('a sample every 0.3 s')""", timeout=30_000)
        wait_for_points(d.page, "chart-hit-rate", "chart-ttft")  # no traffic now: the points are the history's
        assert "a sample every 0.3 s" in d.page.inner_text("#view-overview")
        assert not d.errors, d.errors
        d.close()


def test_requests_before_the_first_sample_are_in_the_charts(dashboard, tiny, tmp_path, monkeypatch):
    """Two requests in a server's first seconds, before its history's first sample: every sample
    then holds the same counts, and the charts still show them (measured from the server's start)
    as the figures above them do, once the history has two samples."""
    with serving_in_process(tiny, tmp_path, monkeypatch, 3.0) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            for _ in range(2):
                r = client.post("/v1/completions", json={"prompt": STORY, "max_tokens": 2})
                assert r.status_code == 200, r.text
            deadline = time.monotonic() + 30
            while len(samples := client.get("/api/v1/stats/history").json()["samples"]) < 2:
                assert time.monotonic() < deadline, "the history took no two samples"
                time.sleep(0.2)
        assert samples[0]["requests_total"] == samples[-1]["requests_total"] == 2  # nothing between samples
        d = dashboard(url=url).open("overview", token=None)
        wait_for_points(d.page, "chart-hit-rate", "chart-ttft")
        assert "No lookups" not in d.page.inner_text("#chart-hit-rate")
        assert "No requests" not in d.page.inner_text("#chart-throughput")
        assert not d.errors, d.errors
        d.close()


def test_chunk_browser_filters_sorts_and_opens_a_chunk(dashboard, server):
    d = dashboard().open("chunks")
    page = d.page
    page.wait_for_selector("#chunk-list tbody tr")
    page.fill("#chunk-filters input[list=chunk-namespaces]", NAMESPACES[0])
    page.click("#chunk-filters button[type=submit]")
    page.wait_for_function("""ns => { const rows = [...document.querySelectorAll('#chunk-list tbody tr')];
        return rows.length > 0 && rows.every(r => r.dataset.namespace === ns); }""", arg=NAMESPACES[0])
    total = server.client.get("/api/v1/chunks", params={"namespace": NAMESPACES[0], "limit": 1}).json()["total"]
    assert f"of {total:,}" in page.inner_text("#chunk-summary")
    page.click("#chunk-list th button:has-text('hits')")  # sort by hits (a column header)
    page.wait_for_selector("#chunk-list th[aria-sort=descending] button:has-text('hits')")
    key = page.get_attribute("#chunk-list tbody tr:first-child", "data-key")
    page.click("#chunk-list tbody tr:first-child button.key")
    page.wait_for_selector("#chunk-detail:not([hidden])")
    assert page.inner_text("#chunk-detail-key") == key
    detail = server.client.get(f"/api/v1/chunks/{key}", headers=ADMIN).json()
    assert page.inner_text("#chunk-detail-tokens").split() == [str(t) for t in detail["token_ids"]]
    assert page.inner_text("#chunk-detail-text").strip()
    page.click("#chunk-detail button:text-is('Pin')")
    page.wait_for_selector("#chunk-detail button:text-is('Unpin')")
    assert server.client.get(f"/api/v1/chunks/{key}").json()["pinned"] is True
    page.click("#chunk-detail button:text-is('Unpin')")
    page.wait_for_selector("#chunk-detail button:text-is('Pin')")
    assert not d.errors
    anonymous = dashboard().open("chunks", token=None)  # a prompt's tokens are shown to a token's holder only
    anonymous.page.wait_for_selector("#chunk-list tbody tr")
    anonymous.page.click("#chunk-list tbody tr:first-child button.key")
    anonymous.page.wait_for_selector("#chunk-detail:not([hidden])")
    for part in ("#chunk-detail-tokens", "#chunk-detail-text"):
        assert anonymous.page.inner_text(part).startswith("hidden: give the admin token")
    assert not anonymous.errors


def test_an_eviction_is_previewed_then_confirmed_and_the_disk_usage_changes(dashboard, server):
    d = dashboard().open("controls")
    page = d.page
    used = "#controls-usage [data-tier=disk]"
    page.wait_for_selector(used)
    before = int(page.get_attribute(used, "data-used-bytes"))
    assert before > 0
    page.select_option("#evict-form select >> nth=0", "disk")
    page.select_option("#evict-form select >> nth=1", "fraction")
    page.fill("#evict-form input >> nth=0", "50")
    page.click("#evict-form button[type=submit]")
    page.wait_for_selector("#evict-preview:has-text('would evict')")
    assert server.client.get("/api/v1/stats").json()["tiers"][2]["used_bytes"] == before  # a dry run changes nothing
    page.click("#evict-confirm")
    page.wait_for_selector("#evict-result:has-text('Evicted')")
    page.wait_for_function(f"() => Number(document.querySelector({used!r}).dataset.usedBytes) < {before}")
    after = int(page.get_attribute(used, "data-used-bytes"))
    d.go("overview")
    page.wait_for_function(f"""() => Number(document.querySelector(
        '#overview-tiers .tier[data-tier=disk]')?.dataset.usedBytes) === {after}""")
    assert not d.errors


def test_a_verify_job_runs_to_completion(dashboard, server):
    send_traffic(server, rounds=1)
    d = dashboard().open("controls")
    page = d.page
    page.click("#start-verify")
    page.wait_for_selector("#job-progress .job[data-kind=verify][data-state=succeeded]", timeout=60_000)
    assert page.eval_on_selector("#job-progress progress", "p => p.value") == 1
    assert "checked" in page.inner_text("#job-progress .job-result")
    page.wait_for_selector("#job-list td:text-is('verify')")
    assert not d.errors


def test_a_quota_a_setting_a_flush_and_a_clear_from_the_page(dashboard, server):
    d = dashboard().open("namespaces")
    page = d.page
    ns = NAMESPACES[1]
    page.click(f"#namespaces-table button[aria-label='Edit the quota of {ns}']")
    page.fill("#quota-editor input", "10 MB")
    page.click("#quota-editor button[type=submit]")
    page.wait_for_selector("#quota-editor .result:has-text('Quota set')")
    quota = {n["namespace"]: n["quota_bytes"] for n in server.client.get("/api/v1/namespaces").json()["items"]}
    assert quota[ns] == 10_000_000
    page.fill("#quota-editor input", "")
    page.click("#quota-editor button[type=submit]")
    page.wait_for_selector("#quota-editor .result:has-text('Quota removed')")

    d.go("settings")
    before = server.client.get("/api/v1/config").json()["cache"]["eviction_policy"]
    other = "lfu" if before == "lru" else "lru"
    page.select_option("#config-form select[name=eviction_policy]", other)
    page.click("#config-form button[type=submit]")
    page.wait_for_selector("#config-form .result:has-text('Changed eviction_policy')")
    assert server.client.get("/api/v1/config").json()["cache"]["eviction_policy"] == other
    page.select_option("#config-form select[name=eviction_policy]", before)
    page.click("#config-form button[type=submit]")
    page.wait_for_selector("#config-form .result:has-text('Changed eviction_policy')")

    d.go("controls")
    page.click("button:text-is('Flush memory tiers to disk')")
    page.wait_for_selector("#view-controls .result:has-text('Flushed:')")
    page.click("button:text-is('Clear…')")
    page.click("button:text-is('Yes, clear device')")
    page.wait_for_selector("#view-controls .confirm:has-text('Removed device')")
    assert not d.errors


def test_a_wrong_token_shows_the_error(dashboard, server):
    d = dashboard().open("controls", token=None)
    page = d.page
    page.wait_for_selector("#controls-usage [data-tier=disk]")  # reads need no token here
    d.give_token("not-the-token")  # the view is loaded again with it: every call answers 401
    page.wait_for_selector("#token-dialog[open]")  # asked again, saying why
    assert "invalid token" in page.inner_text("#token-reason")
    page.keyboard.press("Escape")  # no answer: the calls fail with their 401
    page.wait_for_selector("#errors li[data-status='401']")
    text = page.inner_text("#errors")
    assert "401" in text and "invalid token" in text
    assert page.is_visible("#errors button:text-is('Enter token')")
    # Only the refused calls themselves are logged by the browser.
    assert all("status of 401" in e for e in d.errors), d.errors
    # Declined once, the same token is not asked for again by the next view's calls: they fail at once.
    d.go("namespaces")
    page.wait_for_selector("#errors li[data-status='401']:has-text('namespaces')")
    assert not page.is_visible("#token-dialog[open]")
    page.click("#errors button:text-is('Enter token') >> nth=0")
    page.fill("#token-input", TOKEN)
    page.click("#token-save")
    page.wait_for_selector("#namespaces-table table")  # the view is loaded again with the token
    assert not page.is_visible("#errors li")


def test_no_call_needs_a_token_to_reach_the_page(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and "chunkstore" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert httpx.get(server.url + "/webui/vendor/uPlot.iife.min.js").status_code == 200
    assert httpx.get(server.url + "/webui/../pyproject.toml").status_code == 404
    assert httpx.get(server.url + "/", headers={"Host": "evil.example"}).status_code == 400  # DNS rebinding
    assert httpx.get(server.url + "/api/v1/config", headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_quarantined_chunks_raise_a_warning_on_the_overview(dashboard, server):
    """A chunk file damaged on disk, found by a verify job with repair started from the page, is
    quarantined: the overview then warns."""
    victim = next((server.data / "chunks").rglob("*.kv"))
    data = bytearray(victim.read_bytes())
    data[-8:] = bytes(b ^ 0xFF for b in data[-8:])  # the payload's last bytes: the raw checksum fails
    victim.write_bytes(bytes(data))
    d = dashboard().open("controls")
    page = d.page
    page.check("#view-controls label:has-text('repair') input")
    page.click("#start-verify")
    page.wait_for_selector("#job-progress .job[data-kind=verify][data-state=succeeded]", timeout=60_000)
    assert "quarantined 1" in page.inner_text("#job-list")
    d.go("overview")
    page.wait_for_selector("#view-overview .warning:has-text('quarantined')")
    assert not d.errors


def test_rates_over_time_start_a_new_segment_at_a_restart(dashboard):
    """series.js, in the page: rates between consecutive samples; a counter or uptime going down (a
    restart), a missing counter (an older server) or an empty denominator give a gap (null). A
    process's first sample, its process started within two sample intervals before it, is measured
    from that start (every counter 0), after a null point at the start that keeps the gap."""
    d = dashboard().open("overview")
    result = d.page.evaluate("""async () => {
        const s = await import("./webui/js/series.js");
        const sample = (t, uptime, lookup, hit, done) => ({t, uptime, lookup_tokens: lookup, hit_tokens: hit,
            completion_tokens_total: done, bytes: {}});
        const samples = [sample(0, 10, 100, 50, 0), sample(2, 12, 200, 125, 10), sample(4, 14, 200, 125, 30),
                         sample(6, 1, 40, 20, 5), sample(8, 3, 140, 120, null), sample(10, 5, 240, 170, 15)];
        // A server's first seconds: its two requests were served before its first sample.
        const young = [sample(100, 1.5, 10, 5, 3), sample(102, 3.5, 10, 5, 3)];
        return {hit: s.hitRate(samples), tps: s.tokensPerSecond(samples),
                youngHit: s.hitRate(young), youngTps: s.tokensPerSecond(young)};
    }""")
    assert result["hit"]["xs"] == [2, 4, 5, 6, 8, 10]
    assert result["hit"]["ys"] == [75, None, None, 50, 100, 50]
    assert result["tps"]["ys"] == [5, 10, None, 5, None, None]
    assert result["youngHit"] == {"xs": [100, 102], "ys": [50, None]}
    assert result["youngTps"] == {"xs": [100, 102], "ys": [2, 0]}
    assert not d.errors


def test_the_views_are_reached_and_used_from_the_keyboard(dashboard, server):
    d = dashboard().open("overview")
    page = d.page
    page.wait_for_selector("#overview-tiers .tier")
    for _ in range(12):  # Tab through the header to the Controls link
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Controls":
            break
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # focus is visible
    page.keyboard.press("Enter")
    page.wait_for_selector("#view-controls:not([hidden])")
    assert page.evaluate("[document.activeElement.tagName, document.activeElement.textContent]") == \
        ["H2", "Controls"]  # the view's heading has the focus
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.tagName") in ("SELECT", "INPUT", "BUTTON")
    assert not d.errors


def test_the_offline_dashboard_of_chunkstore_admin(dashboard, server):
    """`chunkstore admin`'s app (a store on disk, no live cache): the page finds the API at the same
    relative path, and the figures the backend has not (serving) read "no data"."""
    backend = StoreBackend(server.data, read_only=True)
    try:
        with LiveServer(create_app(backend, AdminSettings(token=TOKEN))) as live:
            d = dashboard(url=live.url).open("overview")
            page = d.page
            page.wait_for_selector("#overview-tiers .tier[data-tier=disk]")
            assert page.query_selector("#overview-tiers .tier[data-tier=device]") is None
            # No engine here: the live serving figures read "not reported" (the charts may still show
            # the history `chunkstore serve` recorded in the same index).
            page.wait_for_selector("text=not reported (no serving figures)")
            d.go("settings")
            page.wait_for_selector("#config-form")
            assert "store on disk" in page.inner_text("#settings-config")
            d.go("chunks")
            page.wait_for_selector("#chunk-list tbody tr")
            assert not d.errors, d.errors
    finally:
        backend.close()
