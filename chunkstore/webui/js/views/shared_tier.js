// The overview's shared tier (disk.shared_tier of GET /stats: many servers on one PostgreSQL index and one
// bucket): where the tier is, this server's names in it, the publish claims held and lapsed, this server's
// passes through the evictor lock, the bucket's objects as the last gc listed them, this server's read
// health, and every server's counts (hits, misses, hit rate, published, last seen; this one first, then the
// most recently seen). Shown only when the API reports a shared tier; follows the live figures.

import {bytes, dl, fill, h, num, pct, seconds, table, when} from "../dom.js";

// A server's state in the table: the one answering, one seen within stale_after_s, or one gone quiet.
function serverState(s) {
  if (s.is_self) return "self";
  return s.is_stale ? "stale" : "live";
}

const STATE_TEXT = {self: "this server", live: "live", stale: "stale"};

function lastSeen(s, takenAt) {
  if (s.last_seen_at === null) return "not yet written";
  const age = Math.max(0, takenAt - s.last_seen_at);
  return `${when(s.last_seen_at)} (${seconds(age)} ago)`;
}

function serverTable(shared, takenAt) {
  const headers = ["server", "state", "hits", "misses", "hit rate", "published", "dedup hits", "write errors",
    "last seen"];
  const rows = shared.servers.map((s) => [
    h("code", {}, s.server), STATE_TEXT[serverState(s)], num(s.hits), num(s.misses), pct(s.hit_rate), num(s.published),
    num(s.dedup_hits), num(s.write_errors), lastSeen(s, takenAt)]);
  const wrap = table(`Servers (${num(shared.servers.length)})`, headers, rows, {class: "stack", id: "shared-servers"});
  const trs = wrap.querySelectorAll("tbody tr");
  shared.servers.forEach((s, i) => {
    trs[i].dataset.server = s.server;
    trs[i].dataset.state = serverState(s);
  });
  return wrap;
}

// The bucket's objects as the last gc sweep listed them (a request never lists the bucket).
function bucketObjects(b, takenAt) {
  if (!b) return "not listed yet: a gc job (Controls) lists the bucket";
  const age = Math.max(0, takenAt - b.listed_at);
  const orphans = b.orphans ? `, ${num(b.orphans)} without a row` : "";
  return `${num(b.objects)}${orphans}, as of ${when(b.listed_at)} (${seconds(age)} ago, by ${b.listed_by})`;
}

// This server's passes through the fleet's one evictor lock (a bounded tier's puts and every eviction take it
// one at a time across the fleet): how often, and how long it waited and held it, since it started.
function lockPasses(lock, never) {
  if (!lock.acquired) return `not taken by this server (${never})`;
  return `taken ${num(lock.acquired)} time(s) by this server: held ${seconds(lock.held_s)}, `
    + `waited ${seconds(lock.waited_s)} in all`;
}

/** The shared tier's section of the overview: ``render(stats)`` shows it (or hides it without a shared tier). */
export function createSharedTier() {
  const readWarning = h("p", {class: "warning", id: "shared-read-warning", hidden: true});
  const claimsNote = h("p", {class: "hint", id: "shared-claims-note", hidden: true});
  const figures = h("div");
  const servers = h("div");
  const section = h("section", {"aria-labelledby": "shared-h", id: "shared-tier", hidden: true},
    h("h3", {id: "shared-h", class: "section-title"}, "Shared tier"),
    h("p", {class: "hint"}, "Every server of this tier shares one index (PostgreSQL) and one bucket: the disk ",
      "figures above are the whole tier's. Servers are counted by the index since they first wrote their counts; ",
      "a server not seen for a while is shown stale (idle, or gone)."),
    readWarning, figures, claimsNote, servers);

  function render(st) {
    const d = st.disk;
    const shared = d ? d.shared_tier : null;
    section.hidden = !shared;
    if (!shared) return;
    const rh = shared.read_health;
    readWarning.hidden = !rh.degraded;
    if (rh.degraded) {
      fill(readWarning, h("strong", {}, "Shared tier reads failing: "),
        `${num(rh.failures)} failed lookup(s) or read(s) since this server opened the tier; the last, `,
        `${when(rh.last_error_at)}: ${rh.last_error}. Every lookup is a miss until the database and the bucket answer.`);
    }
    fill(figures, dl([
      ["Bucket", h("code", {}, shared.payload_store)],
      ["Database", h("code", {}, shared.index)],
      ["Tier", `${num(d.num_chunks)} chunks, ${bytes(d.stored_bytes)} stored`],
      ["This server", h("code", {}, shared.server_name)],
      ["Writer id", h("code", {}, shared.writer_id)],
      ["Publish claims", `${num(shared.claims)} held, ${num(shared.lapsed_claims)} lapsed`],
      ["Evictor lock", lockPasses(shared.evictor_lock, "only evictions and puts that must evict take it")],
      ["Room lock", lockPasses(shared.room_lock, "only the row commits of puts within a capacity take it")],
      ["Bucket objects", bucketObjects(shared.bucket, st.taken_at)],
      ["Read health", rh.degraded ? `degraded (${num(rh.failures)} failed)`
        : rh.failures ? `OK (${num(rh.failures)} failed before the last success)` : "OK"],
    ], {class: "kpis", id: "shared-figures"}));
    claimsNote.hidden = !shared.lapsed_claims;
    claimsNote.textContent = shared.lapsed_claims
      ? `${num(shared.lapsed_claims)} claim(s) lapsed: writers that died or stalled mid-upload. A gc job (Controls) ` +
        "sweeps them and the objects they left." : "";
    const stale = shared.servers.filter((s) => s.is_stale).length;
    fill(servers, serverTable(shared, st.taken_at),
      stale ? h("p", {class: "hint"}, `${num(stale)} server(s) stale: not seen for ${seconds(shared.stale_after_s)}; `,
        "their rows go after a week.") : null);
  }

  return {section, render};
}
