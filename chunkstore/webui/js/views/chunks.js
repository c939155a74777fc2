// Chunks: the paged, filtered, sorted browser of GET /chunks (keyset paging with next_cursor), and a
// chunk's detail (GET /chunks/{key}): key, parent, tiers, sizes, hits, access times, its file, token
// ids and decoded text; pin / unpin; evict it (and its descendants) after a dry run and a confirmation.

import * as api from "../api.js";
import {bytes, dl, field, fill, h, num, parseBytes, shortKey, when} from "../dom.js";

const SORTS = [["last_access", "last access"], ["hits", "hits"], ["size", "stored size"], ["created", "created"]];
const COLUMNS = [["key"], ["namespace"], ["tokens"], ["stored", "size"], ["raw"], ["hits", "hits"],
  ["last access", "last_access"], ["created", "created"], ["pinned"], ["tiers"]];

function select(options, value) {
  const el = h("select", {}, options.map(([v, label]) => h("option", {value: v}, label)));
  el.value = value;
  return el;
}

function epoch(input) {
  return input.value ? new Date(input.value).getTime() / 1000 : null;
}

export function createChunks(section, ctx) {
  const inputs = {
    namespace: h("input", {type: "text", list: "chunk-namespaces", autocomplete: "off", spellcheck: "false"}),
    tier: select([["", "any (all on disk)"], ["device", "also on device"], ["host", "also on host"]], ""),
    pinned: select([["", "any"], ["true", "pinned"], ["false", "not pinned"]], ""),
    minSize: h("input", {type: "text", inputmode: "decimal", autocomplete: "off", placeholder: "e.g. 10 kB"}),
    maxSize: h("input", {type: "text", inputmode: "decimal", autocomplete: "off", placeholder: "e.g. 1 MB"}),
    after: h("input", {type: "datetime-local", step: "1"}),
    before: h("input", {type: "datetime-local", step: "1"}),
    sort: select(SORTS, "last_access"),
    order: select([["desc", "descending"], ["asc", "ascending"]], "desc"),
    limit: select([["25", "25"], ["50", "50"], ["100", "100"], ["200", "200"]], "25"),
  };
  const namespaces = h("datalist", {id: "chunk-namespaces"});
  const formMessage = h("p", {class: "result", "aria-live": "polite"});
  const form = h("form", {class: "filters", id: "chunk-filters", onsubmit: (event) => {
    event.preventDefault();
    first();
  }},
  h("fieldset", {}, h("legend", {}, "Filter and sort"),
    h("div", {class: "fields"},
      field("Namespace", inputs.namespace), field("Tier", inputs.tier), field("Pinned", inputs.pinned),
      field("Stored size at least", inputs.minSize), field("Stored size at most", inputs.maxSize),
      field("Last access at or after", inputs.after), field("Last access before", inputs.before),
      field("Sort by", inputs.sort), field("Order", inputs.order), field("Rows per page", inputs.limit)),
    h("div", {class: "buttons"}, h("button", {type: "submit"}, "Apply"),
      h("button", {type: "button", class: "secondary", onclick: () => {
        form.reset();
        inputs.sort.value = "last_access";
        inputs.order.value = "desc";
        inputs.limit.value = "25";
        first();
      }}, "Reset"))),
  formMessage, namespaces);
  const summary = h("p", {class: "summary", "aria-live": "polite", id: "chunk-summary"});
  const list = h("div", {id: "chunk-list"});
  const prev = h("button", {type: "button", class: "secondary", onclick: () => go(page - 1)}, "Previous page");
  const next = h("button", {type: "button", class: "secondary", onclick: () => go(page + 1)}, "Next page");
  const detail = h("section", {class: "panel", id: "chunk-detail", hidden: true, "aria-labelledby": "chunk-detail-h"});
  fill(section, h("h2", {tabindex: "-1"}, "Chunks"),
    h("p", {class: "hint"}, "The chunks on disk (the index's rows); with the tier filter, the pages that tier holds, ",
      "including those not on disk yet."),
    form, summary, list, h("div", {class: "buttons pager"}, prev, next), detail);

  let cursors = [null];  // cursors[i]: the cursor of page i (keyset paging)
  let page = 0;

  function query() {
    return {
      namespace: inputs.namespace.value.trim(), tier: inputs.tier.value, pinned: inputs.pinned.value,
      min_size: parseBytes(inputs.minSize.value), max_size: parseBytes(inputs.maxSize.value),
      accessed_after: epoch(inputs.after), accessed_before: epoch(inputs.before),
      sort: inputs.sort.value, order: inputs.order.value, limit: inputs.limit.value,
    };
  }

  function first() {
    cursors = [null];
    go(0);
  }

  function sortBy(sort) {
    if (inputs.sort.value === sort) inputs.order.value = inputs.order.value === "desc" ? "asc" : "desc";
    else {
      inputs.sort.value = sort;
      inputs.order.value = "desc";
    }
    first();
  }

  async function go(index) {
    let q;
    try {
      q = query();
      formMessage.textContent = "";
    } catch (error) {
      formMessage.textContent = error.message;
      return;
    }
    const result = await api.get("chunks", {...q, cursor: cursors[index]}).catch(api.handled);
    if (!result) {
      fill(summary, "The chunks could not be listed (see the error above).");
      return;
    }
    page = index;
    cursors[index + 1] = result.next_cursor;
    const start = index * Number(q.limit);
    fill(summary, result.total ? `Chunks ${num(start + 1)}–${num(start + result.items.length)} of ${num(result.total)}`
      : "No chunk matches these filters.");
    prev.disabled = index === 0;
    next.disabled = !result.next_cursor;
    renderTable(result.items);
  }

  function renderTable(items) {
    const head = COLUMNS.map(([label, sort]) => {
      if (!sort) return h("th", {scope: "col"}, label);
      const active = inputs.sort.value === sort;
      const arrow = active ? (inputs.order.value === "desc" ? " ↓" : " ↑") : "";
      return h("th", {scope: "col", "aria-sort": active ? (inputs.order.value === "desc" ? "descending" : "ascending") : "none"},
        h("button", {type: "button", class: "sort", onclick: () => sortBy(sort)}, label + arrow));
    });
    const rows = items.map((c) => h("tr", {dataset: {key: c.key, namespace: c.namespace}},
      h("td", {}, h("button", {type: "button", class: "link key", title: c.key, "aria-label": `Open chunk ${c.key}`,
                               onclick: () => open(c.key, c)}, shortKey(c.key))),
      h("td", {}, c.namespace), h("td", {}, num(c.num_tokens)), h("td", {}, bytes(c.stored_bytes)),
      h("td", {}, bytes(c.raw_bytes)), h("td", {}, num(c.hit_count)), h("td", {}, when(c.last_access_at)),
      h("td", {}, when(c.created_at)), h("td", {}, c.pinned ? "pinned" : "—"), h("td", {}, c.tiers.join(", "))));
    fill(list, h("div", {class: "table-wrap"}, h("table", {class: "chunks"},
      h("caption", {class: "visually-hidden"}, "Chunks (sortable columns have buttons)"),
      h("thead", {}, h("tr", {}, head)), h("tbody", {}, rows))));
  }

  // A chunk's tokens are a tenant's prompt: the API shows them only to a token's holder.
  const HIDDEN = "hidden: give the admin token (or this namespace's token) to see a chunk's tokens";

  /** A chunk's detail: GET /chunks/{key} for one on disk; a page held only in memory (``row`` from the
   * list, with no disk figures) has no file, token ids or text to show yet. */
  async function open(key, row = null) {
    const isMemoryOnly = row !== null && row.stored_bytes === null;
    const c = isMemoryOnly ? {...row, file: null, token_ids: null, text: null, num_children: null, is_parent_stored: false}
      : await api.get(`chunks/${key}`).catch(api.handled);
    if (!c) return;
    const file = c.file;
    const pin = h("button", {type: "button", onclick: async () => {
      const changed = await api.post(`chunks/${key}/${c.pinned ? "unpin" : "pin"}`).catch(api.handled);
      if (changed) {
        await open(key);
        go(page);
      }
    }}, c.pinned ? "Unpin" : "Pin");
    const descendants = h("input", {type: "checkbox", checked: c.num_children > 0 || isMemoryOnly});
    const evictTier = select(c.tiers.map((t) => [t, t]), c.tiers.includes("disk") ? "disk" : c.tiers[0]);
    const evictBox = h("div", {class: "confirm", "aria-live": "polite"});
    evictTier.addEventListener("change", () => fill(evictBox));
    descendants.addEventListener("change", () => fill(evictBox));
    const evict = async (dryRun) => {
      const body = {tier: evictTier.value, key, descendants: descendants.checked, dry_run: dryRun};
      const r = await api.post("evict", body).catch(api.handled);
      if (!r) {
        fill(evictBox, "Nothing was evicted (see the error above).");
        return;
      }
      if (dryRun) {
        const count = r.tier === "disk" ? `${num(r.num_chunks)} chunk(s)` : `${num(r.num_pages)} page(s)`;
        const confirm = h("button", {type: "button", class: "danger", onclick: () => evict(false)},
          `Evict ${count} from ${r.tier} now`);
        fill(evictBox, h("p", {}, `Dry run: would evict ${count} from ${r.tier}, ${bytes(r.num_bytes)}`,
          r.skipped_pinned ? `; ${num(r.skipped_pinned)} pinned kept` : "",
          r.skipped_locked ? `; ${num(r.skipped_locked)} locked kept` : "", "."),
        (r.num_chunks || r.num_pages) ? h("div", {class: "buttons"}, confirm,
          h("button", {type: "button", class: "secondary", onclick: () => fill(evictBox)}, "Cancel")) : null);
        if (r.num_chunks || r.num_pages) confirm.focus();
      } else {
        fill(detail, h("h3", {id: "chunk-detail-h", tabindex: "-1"}, `Chunk ${shortKey(key)}`),
          h("p", {class: "result"}, `Evicted ${r.tier === "disk" ? `${num(r.num_chunks)} chunk(s)` : `${num(r.num_pages)} page(s)`} ` +
            `from ${r.tier}, ${bytes(r.num_bytes)}.`),
          h("button", {type: "button", class: "secondary", onclick: () => { detail.hidden = true; }}, "Close"));
        detail.querySelector("h3").focus();
        go(0);
      }
    };
    const parent = c.is_parent_stored
      ? h("button", {type: "button", class: "link key", onclick: () => open(c.parent_key)}, c.parent_key)
      : h("span", {}, h("code", {}, c.parent_key), isMemoryOnly ? "" : " (not stored: the first page, or a hole)");
    fill(detail,
      h("h3", {id: "chunk-detail-h", tabindex: "-1"}, `Chunk ${shortKey(key)}`),
      dl([["Key", h("code", {class: "key", id: "chunk-detail-key"}, c.key)], ["Parent", parent],
        ["Namespace", c.namespace], ["Tiers", c.tiers.join(", ")], ["Tokens", num(c.num_tokens)],
        ["Stored / raw", `${bytes(c.stored_bytes)} / ${bytes(c.raw_bytes)}`], ["Hits", num(c.hit_count)],
        ["Created", when(c.created_at)], ["Last access", when(c.last_access_at)], ["Pinned", c.pinned ? "yes" : "no"],
        ["Stored children", num(c.num_children)],
        ["File", !file ? "none: held only in memory, not on disk yet"
          : `${file.status} · ${bytes(file.file_bytes)}` + (file.codec ? ` · ${file.codec} · ${file.dtype} ` +
            `[${(file.shape || []).join("×")}]` : "")],
        ["Checksum", file?.checksum ? h("code", {}, file.checksum) : "—"]], {class: "detail"}),
      h("h4", {}, `Token ids (${c.token_ids ? c.token_ids.length : 0})`),
      h("pre", {class: "tokens", id: "chunk-detail-tokens"}, c.token_ids ? c.token_ids.join(" ")
        : isMemoryOnly ? "not on disk yet (the ids are read from the chunk file)"
        : c.is_content_hidden ? HIDDEN : "unreadable file"),
      h("h4", {}, "Decoded text"),
      h("pre", {class: "text", id: "chunk-detail-text"}, c.text ??
        (c.is_content_hidden ? HIDDEN : "not available (this backend has no tokenizer)")),
      h("div", {class: "buttons"}, isMemoryOnly ? null : pin,
        h("button", {type: "button", class: "secondary", onclick: () => { detail.hidden = true; }}, "Close")),
      h("fieldset", {}, h("legend", {}, "Evict this chunk"),
        field("From", evictTier),
        h("label", {class: "check"}, descendants, isMemoryOnly ? " and its descendants"
          : ` and its descendants (${num(c.num_children)} stored chunk(s) extend it directly)`),
        h("div", {class: "buttons"}, h("button", {type: "button", onclick: () => evict(true)}, "Preview eviction (dry run)")),
        evictBox));
    detail.hidden = false;
    detail.querySelector("h3").focus();
  }

  async function loadNamespaces() {
    const ns = await api.get("namespaces").catch(api.handled);
    if (ns) fill(namespaces, ns.items.map((n) => h("option", {value: n.namespace})));
  }

  return {
    show(params) {
      if (params && params.has("namespace")) inputs.namespace.value = params.get("namespace");
      loadNamespaces();
      first();
    },
    hide() {},
  };
}
