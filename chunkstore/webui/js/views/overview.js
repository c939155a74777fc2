// Overview: the tiers' usage (used / capacity and the evictable share), hit rate, TTFT, throughput and
// transfer rates over time (GET /stats/history, then live from GET /events), bytes moved per path,
// queue depths, compression and quarantined chunks, all as the API reports them. A badge in the status
// line says whether the disk tier's writes succeed (disk.write_health.degraded: the last write failed).
// On a shared tier (disk.shared_tier) a section shows the tier and its servers (shared_tier.js).

import * as api from "../api.js";
import {TimeChart} from "../charts.js";
import {bytes, bytesPerSecond, dl, fill, h, num, pct, seconds, table, when} from "../dom.js";
import * as series from "../series.js";
import {createSharedTier} from "./shared_tier.js";

const TIER_NAMES = {device: "Device", host: "Host", disk: "Disk"};

// The disk's write health as a badge: hidden without a disk tier (and for a namespace's figures).
function showDiskHealth(badge, note, wh) {
  badge.hidden = !wh;
  note.hidden = !(wh && wh.degraded);
  if (!wh) return;
  badge.dataset.state = wh.degraded ? "degraded" : "ok";
  badge.textContent = wh.degraded ? "Disk degraded: writes failing" : "Disk writes OK";
  badge.title = wh.last_error ? `last failed write: ${wh.last_error}` : "no failed write since the store opened";
  if (wh.degraded) {
    fill(note, h("strong", {}, "Disk degraded: "), `${num(wh.failures)} write(s) failed since the store opened `,
      `(${num(wh.failed_pages)} page(s)); the last, ${when(wh.last_error_at)}: ${wh.last_error}. `,
      "New pages stay in memory only (serving goes on) until a write succeeds: free space in the data folder.");
  }
}

function tierBox(t) {
  const cap = t.capacity_bytes;
  const share = (x) => (cap ? Math.min(1, x / cap) : 0);
  const evictable = t.evictable_bytes ?? null;
  const usedText = cap === null ? `${bytes(t.used_bytes)} (no capacity set: unbounded)`
    : `${bytes(t.used_bytes)} of ${bytes(cap)} (${pct(t.used_bytes / cap)})`;
  const heldBar = h("span", {class: "seg held"});  // used and not evictable now (locked, in flight)
  const evictableBar = h("span", {class: "seg evictable"});
  evictableBar.style.width = `${share(evictable ?? 0) * 100}%`;
  heldBar.style.width = `${Math.max(0, share(t.used_bytes) - share(evictable ?? 0)) * 100}%`;
  const details = [];
  if (evictable !== null) {
    details.push(`evictable ${bytes(evictable)} (${t.used_bytes ? pct(evictable / t.used_bytes) : "—"} of used)`);
    details.push(`locked ${bytes(t.locked_bytes)}`, `cached ${bytes(t.cached_bytes)}`);
  }
  if (t.num_chunks !== null && t.num_chunks !== undefined) details.push(`${num(t.num_chunks)} chunks`);
  return h("div", {class: "tier", dataset: {tier: t.name, usedBytes: String(t.used_bytes)}},
    h("div", {class: "tier-head"}, h("h3", {}, TIER_NAMES[t.name] || t.name), h("span", {class: "tier-used"}, usedText)),
    h("div", {class: "bar", role: "img",
              "aria-label": `${t.name}: ${usedText}${evictable !== null ? `, evictable ${bytes(evictable)}` : ""}`},
      heldBar, evictableBar),
    h("p", {class: "tier-detail"}, details.join(" · ") || "evictable share: not reported for this tier"));
}

export function createOverview(section, ctx) {
  const status = h("p", {class: "status", "aria-live": "polite"});
  const live = h("span", {class: "live", dataset: {state: "off"}}, "not connected");
  const diskHealth = h("span", {class: "badge", id: "disk-health", role: "status", hidden: true});
  const warning = h("p", {class: "warning", hidden: true});
  const writeWarning = h("p", {class: "warning", id: "disk-write-warning", hidden: true});
  const tiers = h("div", {class: "tiers", id: "overview-tiers"});
  const sharedTier = createSharedTier();
  const figures = h("div", {class: "figures"});
  const boxes = {hit: h("div", {id: "chart-hit-rate"}), ttft: h("div", {id: "chart-ttft"}),
                 throughput: h("div", {id: "chart-throughput"}), transfers: h("div", {id: "chart-transfers"})};
  const historyNote = h("p", {class: "hint", id: "history-note"});
  const paths = h("div");
  const queues = h("div");
  const evicted = h("div");
  fill(section,
    h("h2", {tabindex: "-1"}, "Overview"),
    h("div", {class: "status-line"}, status, live, diskHealth),
    writeWarning,
    warning,
    h("section", {"aria-labelledby": "tiers-h"}, h("h3", {id: "tiers-h", class: "section-title"}, "Tiers"), tiers),
    sharedTier.section,
    figures,
    h("section", {"aria-labelledby": "charts-h"},
      h("h3", {id: "charts-h", class: "section-title"}, "Over time"), historyNote,
      h("div", {class: "charts"},
        h("figure", {}, h("figcaption", {}, "Hit rate (hit tokens / looked-up tokens)"), boxes.hit),
        h("figure", {}, h("figcaption", {}, "Time to first token (average per interval)"), boxes.ttft),
        h("figure", {}, h("figcaption", {}, "Throughput (completion tokens and requests per second)"), boxes.throughput),
        h("figure", {}, h("figcaption", {}, "Transfers per path (bytes per second)"), boxes.transfers))),
    paths,  // the full width: its seven columns fit at 1280 px without scrolling
    h("div", {class: "grid2"}, queues, evicted));

  let charts = null;
  let samples = [];
  let controller = null;

  function makeCharts() {
    charts = {
      hit: new TimeChart(boxes.hit, {series: [{label: "hit rate"}], yMax: 100, format: (v) => `${v.toFixed(0)} %`}),
      ttft: new TimeChart(boxes.ttft, {series: [{label: "TTFT"}], format: (v) => `${v.toFixed(v < 10 ? 1 : 0)} ms`}),
      throughput: new TimeChart(boxes.throughput, {series: [{label: "tokens/s"}, {label: "requests/s"}],
                                                   format: (v) => (v < 10 ? v.toFixed(2) : v.toFixed(0))}),
      transfers: new TimeChart(boxes.transfers, {series: series.PATHS.map((p) => ({label: p.replaceAll("_", " ")})),
                                                 format: bytesPerSecond}),
    };
  }

  function drawCharts() {
    const has = (f) => samples.some((s) => f(s) !== null);
    const hit = series.hitRate(samples);
    charts.hit.setData(hit.xs, [hit.ys],
      has((s) => s.lookup_tokens) ? "No lookups in this period" : "No lookup figures (no live cache)");
    const servingNote = has((s) => s.ttft_count) || has((s) => s.requests_total)
      ? "No requests in this period" : "Not reported by this server (no serving figures)";
    const ttft = series.ttftMs(samples);
    charts.ttft.setData(ttft.xs, [ttft.ys], servingNote);
    const tps = series.tokensPerSecond(samples);
    const rps = series.requestsPerSecond(samples);
    charts.throughput.setData(tps.xs, [tps.ys, rps.ys], servingNote);
    const rates = series.PATHS.map((p) => series.pathBytesPerSecond(samples, p));
    charts.transfers.setData(rates[0].xs, rates.map((r) => r.ys),
      has((s) => s.bytes.host_to_disk) ? "No transfers yet" : "No transfer figures (no live cache)");
  }

  function render(st) {
    fill(status, `Backend: ${st.backend === "cache" ? "live cache" : "store on disk (offline)"}`,
      st.namespace ? ` · namespace ${st.namespace}` : "", ` · up ${seconds(st.uptime_s)} · figures of ${when(st.taken_at)}`);
    fill(tiers, st.tiers.map(tierBox));
    sharedTier.render(st);
    const d = st.disk;
    showDiskHealth(diskHealth, writeWarning, d ? d.write_health : null);
    warning.hidden = !(d && (d.quarantined > 0 || d.auth_failures > 0));
    if (d && d.auth_failures > 0) {
      fill(warning, h("strong", {}, "Security: "), `${num(d.auth_failures)} sealed chunk(s) failed authentication `,
        "(forged, damaged or moved) and were not served; they are quarantined. Someone with access to the bucket or ",
        "the data folder may have written them: see the server's log (chunkstore.security).");
    } else if (d && d.quarantined > 0) {
      fill(warning, h("strong", {}, "Warning: "), `${num(d.quarantined)} chunk file(s) failed verification and were `,
        "quarantined. Run a verify job (Controls) and look at the quarantine folder of the store.");
    }
    const s = st.serving || null;
    const pairs = [];
    if (st.hits) pairs.push(["Hit rate", pct(st.hits.hit_rate)], ["Lookups", num(st.hits.lookups)],
      ["Looked-up tokens", num(st.hits.lookup_tokens)],
      ["Hit tokens by tier", Object.entries(st.hits.hit_tokens).map(([k, v]) => `${k} ${num(v)}`).join(", ") || "—"]);
    if (s) pairs.push(["Requests", `${num(s.requests_total)} (${num(s.requests_active)} active, ${num(s.requests_failed)} failed)`],
      ["Average TTFT", seconds(s.ttft_avg_s)],
      ["Average latency", s.requests_total ? seconds(s.latency_sum_s / s.requests_total) : "—"],
      ["Cached prompt tokens", `${num(s.cached_tokens_total)} of ${num(s.prompt_tokens_total)}`],
      ["Completion tokens", num(s.completion_tokens_total)]);
    else pairs.push(["Requests", "not reported (no serving figures)"]);
    if (d) pairs.push(["Compression ratio", `${d.compression_ratio.toFixed(2)}×`],
      ["Disk raw / stored", `${bytes(d.raw_bytes)} / ${bytes(d.stored_bytes)}`],
      ["Disk hits / misses", `${num(d.hits)} / ${num(d.misses)}`], ["Dedup hits", num(d.dedup_hits)],
      ["Quarantined chunks", num(d.quarantined)], ["Write errors", num(d.write_errors)],
      ["Sealed", d.sealed ? "yes" : "no"], ["Authentication failures", num(d.auth_failures)],
      ["Failed writes since opened", d.write_health ? num(d.write_health.failures) : "—"],
      ["Disk read-only", d.read_only ? "yes" : "no"]);
    fill(figures, h("h3", {class: "section-title"}, "Figures"), dl(pairs, {class: "kpis", id: "overview-figures"}));
    const pathRows = Object.entries(st.paths).map(([name, p]) => [name.replaceAll("_", " "), bytes(p.num_bytes),
      num(p.num_pages), num(p.num_ops), num(p.failed_pages), bytesPerSecond(p.gbps * 1e9), seconds(p.max_s)]);
    fill(paths, pathRows.length
      ? table("Bytes moved per path", ["path", "bytes", "pages", "operations", "failed pages", "rate", "longest"], pathRows,
        {class: "stack"})
      : h("p", {class: "hint"}, "No transfer paths (no memory tiers on this backend)."));
    const queueRows = Object.entries(st.queue_depths).map(([k, v]) => [k.replaceAll("_", " "), num(v)]);
    fill(queues, queueRows.length ? table("Queue depths", ["queue", "operations waiting"], queueRows)
      : h("p", {class: "hint"}, "No transfer queues (no memory tiers on this backend)."));
    const evictedRows = Object.entries(st.evicted_pages).map(([k, v]) => [k.replaceAll("_", " "), num(v)]);
    if (st.backups_skipped !== null) evictedRows.push(["backups skipped", num(st.backups_skipped)]);
    fill(evicted, evictedRows.length ? table("Evictions", ["what", "count"], evictedRows) : null);
  }

  function setLive(state, text) {
    live.dataset.state = state;
    live.textContent = text;
  }

  async function loadHistory(signal) {
    const history = await api.get("stats/history", {limit: 1000}, {signal});
    const fresh = history.samples.map(series.fromHistory);
    for (const s of samples) series.push(fresh, s);  // live samples that came in meanwhile
    samples = fresh;
    historyNote.textContent = history.is_recording
      ? `History: a sample every ${history.interval_s} s (${history.samples.length} loaded), then live.`
      : "History is not being recorded by this server (is_recording: false): live figures only.";
    drawCharts();
  }

  async function follow(signal) {
    while (!signal.aborted) {
      setLive("connecting", "connecting…");
      try {
        for await (const {event, data} of api.events({max_events: 1000}, signal)) {
          if (event === "stats") {
            render(data);
            series.push(samples, series.fromStats(data));
            drawCharts();
            setLive("live", `live · ${when(data.taken_at).slice(11)}`);
          } else if (event === "unavailable") {
            setLive("unavailable", `unavailable: ${data.message}`);
          } else if (event === "end") {
            break;
          }
        }
      } catch (error) {
        if (signal.aborted) return;
        api.handled(error);  // a fault of the page is thrown on, not retried
        if (error.status === 401 || error.status === 403) {
          setLive("stopped", `live figures stopped (${error.status})`);
          return;
        }
        setLive("retrying", "connection lost: retrying in 5 s");
        await new Promise((resolve) => setTimeout(resolve, 5000));
      }
    }
  }

  return {
    show() {
      if (!charts) makeCharts();
      if (controller) controller.abort();
      controller = new AbortController();
      const {signal} = controller;
      api.get("stats", {}, {signal}).then(render).catch(api.handled);  // failures are shown by api.js
      loadHistory(signal).catch(api.handled);
      follow(signal);
    },
    hide() {
      if (controller) controller.abort();
      controller = null;
      setLive("off", "not connected");
    },
  };
}
