// Namespaces: usage, quota and hit rate per namespace (GET /namespaces); a quota is edited in place
// (PUT /namespaces/{namespace}/quota: a size, or blank to remove it).

import * as api from "../api.js";
import {bytes, field, fill, h, num, parseBytes, pct, table} from "../dom.js";

export function createNamespaces(section, ctx) {
  const body = h("div", {id: "namespaces-table"});
  const editor = h("div", {class: "panel", id: "quota-editor", hidden: true});
  fill(section, h("h2", {tabindex: "-1"}, "Namespaces"),
    h("p", {class: "hint"}, "Per namespace: on a live cache the token hit rate (cached tokens used / tokens looked up) ",
      "and the pages held on device and host; disk usage, quota and disk hit rate (chunk loads found on disk)."),
    body, editor);

  function edit(ns) {
    const input = h("input", {type: "text", inputmode: "decimal", autocomplete: "off",
                              value: ns.quota_bytes === null ? "" : String(ns.quota_bytes)});
    const message = h("p", {class: "result", "aria-live": "polite"});
    const form = h("form", {onsubmit: async (event) => {
      event.preventDefault();
      let quota;
      try {
        quota = parseBytes(input.value);
      } catch (error) {
        message.textContent = error.message;
        input.focus();
        return;
      }
      try {
        await api.call("PUT", `namespaces/${encodeURIComponent(ns.namespace)}/quota`, {body: {quota_bytes: quota}});
        message.textContent = quota === null ? "Quota removed." : `Quota set to ${bytes(quota)}.`;
        await load();
      } catch (error) {
        api.handled(error);
        message.textContent = "The quota was not changed (see the error above).";
      }
    }},
    h("h3", {}, `Quota of ${ns.namespace}`),
    field("Quota", input, "bytes, or a size such as 500 MB, 2 GB, 1.5 GiB; blank removes the quota. " +
      "The namespace's next put evicts within it to fit."),
    h("div", {class: "buttons"}, h("button", {type: "submit"}, "Save quota"),
      h("button", {type: "button", class: "secondary", onclick: () => { editor.hidden = true; }}, "Close")),
    message);
    fill(editor, form);
    editor.hidden = false;
    input.focus();
  }

  async function load() {
    const list = await api.get("namespaces");
    if (!list.items.length) {
      fill(body, h("p", {}, "No namespaces yet: nothing is stored and no quota is set."));
      return;
    }
    const live = list.items.some((n) => n.device_pages !== null && n.device_pages !== undefined);
    const lookups = list.items.some((n) => n.token_hit_rate !== null && n.token_hit_rate !== undefined);
    const headers = ["namespace", ...(lookups ? ["token hit rate", "lookups"] : []), "chunks", "stored", "raw", "quota",
      "quota used", "disk hits / misses", "disk hit rate", ...(live ? ["device pages", "host pages"] : []), ""];
    const rows = list.items.map((n) => [
      h("a", {href: `#chunks?namespace=${encodeURIComponent(n.namespace)}`, title: "Browse its chunks"}, n.namespace),
      ...(lookups ? [n.lookup_tokens ? pct(n.token_hit_rate) : "—", num(n.lookups)] : []),
      num(n.num_chunks), bytes(n.stored_bytes), bytes(n.raw_bytes),
      n.quota_bytes === null ? "none" : bytes(n.quota_bytes),
      n.quota_bytes ? pct(n.stored_bytes / n.quota_bytes) : "—",
      `${num(n.hits)} / ${num(n.misses)}`, n.hits + n.misses ? pct(n.hit_rate) : "—",
      ...(live ? [num(n.device_pages), num(n.host_pages)] : []),
      h("button", {type: "button", onclick: () => edit(n), "aria-label": `Edit the quota of ${n.namespace}`}, "Edit quota"),
    ]);
    fill(body, table(null, headers, rows, {class: "stack"}));
  }

  return {
    show() {
      load().catch((error) => {
        api.handled(error);
        fill(body, h("p", {}, "Namespaces could not be loaded (see the error above)."));
      });
    },
    hide() {},
  };
}
