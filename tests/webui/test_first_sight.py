"""The dashboard on first sight, in a real browser over the management API of a real store on disk
served by uvicorn on 127.0.0.1: without tenants the figures show at once with no question asked; with
tenants the token dialog comes up on the first 401 and the same calls are made again once the token
is given; an action without a token asks for it and is then done; sizes and rates keep their mantissa
below 1000; a time axis with one sample, or samples within a second, has no sub-second tick."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from chunkstore.api import AdminSettings, StoreBackend, create_app
from tests.helpers.api import fill_store
from tests.helpers.server import LiveServer
from tests.helpers.webui import SHOTS, TOKEN, Dashboard

TENANT_TOKEN = "webui-test-tenant-token"
# Counts the token dialog's openings from the first script on (a dialog shown and closed between two
# looks would otherwise go unseen).
COUNT_DIALOGS = """window.tokenDialogsShown = 0;
const showModal = HTMLDialogElement.prototype.showModal;
HTMLDialogElement.prototype.showModal = function () { window.tokenDialogsShown++; return showModal.call(this); };"""


def serve_store(tmp_path_factory, name: str, settings: AdminSettings) -> Iterator[str]:
    root = tmp_path_factory.mktemp(name) / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        with LiveServer(create_app(backend, settings)) as live:
            yield live.url
    finally:
        backend.close()


@pytest.fixture(scope="module")
def open_url(tmp_path_factory) -> Iterator[str]:
    """Loopback, an admin token and no tenant: reads need no token."""
    yield from serve_store(tmp_path_factory, "open", AdminSettings(token=TOKEN))


@pytest.fixture(scope="module")
def tenant_url(tmp_path_factory) -> Iterator[str]:
    """Loopback with a namespace token: every call, reads too, needs a token."""
    yield from serve_store(tmp_path_factory, "tenants",
                           AdminSettings(token=TOKEN, namespace_tokens=(f"other={TENANT_TOKEN}",)))


@pytest.fixture
def page_on(browser) -> Iterator:
    opened: list[Dashboard] = []

    def make(url: str, width: int = 1280, height: int = 900) -> Dashboard:
        d = Dashboard(browser, url, width, height)
        d.page.add_init_script(COUNT_DIALOGS)
        opened.append(d)
        return d

    yield make
    for d in opened:
        d.close()


def only_refused_calls(errors: list[str]) -> bool:
    """The browser logs each call answered 401 as a console error; nothing else may be logged."""
    return all("status of 401" in e for e in errors)


def test_first_sight_without_tenants_shows_the_figures_and_asks_nothing(page_on, open_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width, height in ((1280, 900), (390, 844)):
        d = page_on(open_url, width, height)
        page = d.page
        page.goto(f"{open_url}/")
        page.wait_for_selector("#overview-tiers .tier[data-tier=disk]", timeout=10_000)
        page.wait_for_selector(".live[data-state=live]")
        assert "Disk raw / stored" in page.inner_text("#overview-figures")
        assert page.evaluate("window.tokenDialogsShown") == 0
        assert page.is_hidden("#errors")
        assert page.inner_text("#auth-state") == "No token"
        assert "e+" not in page.inner_text("#view-overview")  # no "1.00e+3 MB"
        page.screenshot(path=str(SHOTS / f"first-sight-{width}.png"), full_page=True)
        assert not d.errors, d.errors


def test_with_tenants_the_first_401_asks_and_the_data_comes_with_the_token(page_on, tenant_url):
    assert httpx.get(f"{tenant_url}/api/v1/stats").status_code == 401  # the rule this test is about
    d = page_on(tenant_url)
    page = d.page
    page.goto(f"{tenant_url}/")
    page.wait_for_selector("#token-dialog[open]")
    reason = page.inner_text("#token-reason")
    assert "answered 401" in reason and "made again" in reason
    assert page.query_selector("#overview-tiers .tier") is None  # nothing could be read yet
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "token-asked-1280.png"))
    page.fill("#token-input", TOKEN)
    page.click("#token-save")
    page.wait_for_selector("#overview-tiers .tier[data-tier=disk]")  # the same calls, made again
    page.wait_for_selector(".live[data-state=live]")  # the event stream too
    page.wait_for_function("() => document.querySelector('#history-note')?.textContent.startsWith('History')")
    assert page.evaluate("window.tokenDialogsShown") == 1  # one question for all the refused calls
    assert page.is_hidden("#errors")  # answered: not an error
    assert page.inner_text("#auth-state") == "Token: set (this tab)"
    assert only_refused_calls(d.errors), d.errors


def test_with_tenants_no_answer_lists_the_401_with_enter_token(page_on, tenant_url):
    d = page_on(tenant_url)
    page = d.page
    page.goto(f"{tenant_url}/#namespaces")
    page.wait_for_selector("#token-dialog[open]")
    page.click("#token-none")  # no token: the refused calls fail, as they said
    page.wait_for_selector("#errors li[data-status='401']")
    assert page.is_visible("#errors button:text-is('Enter token')")
    page.click("#errors button:text-is('Enter token')")
    page.fill("#token-input", TENANT_TOKEN)  # a tenant's token: its own namespace only
    page.click("#token-save")
    page.wait_for_selector("#namespaces-table a[href='#chunks?namespace=other']")
    assert page.query_selector("#namespaces-table a[href='#chunks?namespace=default']") is None
    assert page.is_hidden("#errors")
    assert only_refused_calls(d.errors), d.errors


def test_an_action_without_a_token_asks_for_it_and_is_then_done(page_on, open_url):
    d = page_on(open_url)
    page = d.page
    page.goto(f"{open_url}/#chunks")
    page.wait_for_selector("#chunk-list tbody tr button.key")
    key = page.get_attribute("#chunk-list tbody tr:first-child", "data-key")
    if httpx.get(f"{open_url}/api/v1/chunks/{key}").json()["pinned"]:  # a rerun in the same module: unpin first
        httpx.post(f"{open_url}/api/v1/chunks/{key}/unpin", headers={"Authorization": f"Bearer {TOKEN}"})
    page.click("#chunk-list tbody tr:first-child button.key")
    page.wait_for_selector("#chunk-detail button:text-is('Pin')")
    assert page.evaluate("window.tokenDialogsShown") == 0  # reading asked nothing
    page.click("#chunk-detail button:text-is('Pin')")
    page.wait_for_selector("#token-dialog[open]")
    assert "POST chunks/" in page.inner_text("#token-reason")
    page.fill("#token-input", TOKEN)
    page.click("#token-save")
    page.wait_for_selector("#chunk-detail button:text-is('Unpin')")  # the same POST, made again
    assert httpx.get(f"{open_url}/api/v1/chunks/{key}").json()["pinned"] is True
    assert page.is_hidden("#errors")
    assert only_refused_calls(d.errors), d.errors


def test_sizes_and_rates_keep_the_mantissa_below_1000(page_on, open_url):
    d = page_on(open_url)
    d.page.goto(f"{open_url}/")
    shown = d.page.evaluate("""async () => {
        const dom = await import("./webui/js/dom.js");
        const sizes = [0, 512, 999, 1000, 999e3, 999.7e3, 999e6, 999.7e6, 1e9, 1.5e12, 999.95e12, -2.5e9, null];
        const rate = dom.bytesPerSecond || (() => "no bytesPerSecond");
        return {bytes: sizes.map(dom.bytes), rates: [12.345, 999.7, 2.5e9, 0].map(rate)};
    }""")
    assert shown["bytes"] == ["0 B", "512 B", "999 B", "1.00 kB", "999 kB", "1.00 MB", "999 MB", "1.00 GB",
                              "1.00 GB", "1.50 TB", "1.00 PB", "-2.50 GB", "—"]
    assert shown["rates"] == ["12.3 B/s", "1.00 kB/s", "2.50 GB/s", "0 B/s"]
    assert not d.errors, d.errors


def test_a_time_axis_with_one_sample_or_one_second_has_no_sub_second_tick(page_on, open_url):
    d = page_on(open_url)
    d.page.goto(f"{open_url}/")
    axes = d.page.evaluate("""async () => {
        const {TimeChart} = await import("./webui/js/charts.js");
        const t = 1764620000;
        const out = {};
        for (const [name, xs] of [["one", [t]], ["half", [t, t + 0.5]], ["second", [t, t + 0.5, t + 1]]]) {
            const box = document.createElement("div");
            box.style.width = "600px";
            document.body.append(box);
            const chart = new TimeChart(box, {series: [{label: "rate"}], format: (v) => String(v)});
            chart.setData(xs, [xs.map(() => 5)]);
            await new Promise((resolve) => setTimeout(resolve, 100));  // uPlot draws on the next frame
            const x = chart.plot.axes[0];
            out[name] = {span: chart.plot.scales.x.max - chart.plot.scales.x.min, splits: x._splits,
                         labels: x._values, points: box.dataset.points};
        }
        return out;
    }""")
    for name, axis in axes.items():
        assert 60 <= axis["span"] <= 120, (name, axis)  # about a minute: neither milliseconds nor years
        assert all(float(s).is_integer() for s in axis["splits"]), (name, axis)
        assert all(b - a >= 1 for a, b in zip(axis["splits"], axis["splits"][1:])), (name, axis)
        assert not any("." in label.split("\n")[0] for label in axis["labels"]), (name, axis)  # no ":20.500"
        assert axis["points"] != "0"
    assert not d.errors, d.errors


def test_a_rate_axis_is_as_wide_as_its_labels(page_on, open_url):
    """Labels such as "2.00 GB/s" fit in the y axis (at a fixed width they were cut at the chart's edge)."""
    d = page_on(open_url)
    d.page.goto(f"{open_url}/")
    fit = d.page.evaluate("""async () => {
        const {TimeChart} = await import("./webui/js/charts.js");
        const {bytesPerSecond} = await import("./webui/js/dom.js");
        const box = document.createElement("div");
        box.style.width = "600px";
        document.body.append(box);
        const chart = new TimeChart(box, {series: [{label: "disk to host"}], format: bytesPerSecond});
        const t = 1764620000;
        chart.setData([t, t + 1, t + 2], [[1.5e9, 2.2e9, 0.4e9]]);
        await new Promise((resolve) => setTimeout(resolve, 100));
        const y = chart.plot.axes[1];
        const ctx = document.createElement("canvas").getContext("2d");
        ctx.font = y.font[0];
        const widest = Math.max(...y._values.map((v) => ctx.measureText(v).width / devicePixelRatio));
        return {labels: y._values, sizePx: y._size, widestPx: widest, tickPx: y.ticks.size + y.gap};
    }""")
    assert any(label.endswith("GB/s") for label in fit["labels"]), fit
    assert fit["sizePx"] >= fit["widestPx"] + fit["tickPx"], fit
    assert not d.errors, d.errors
