// Controls: evict by tier / size / namespace / age (a dry run first, then a confirmation with the same
// request), flush, clear (with a confirmation), and verify / rebuild / gc jobs followed to their end
// with a progress bar and their result.

import * as api from "../api.js";
import {bytes, dl, field, fill, h, num, parseBytes, pct, seconds, table, when} from "../dom.js";

const AGE_UNITS = [["1", "seconds"], ["60", "minutes"], ["3600", "hours"], ["86400", "days"]];

function select(options, value) {
  const el = h("select", {}, options.map(([v, label]) => h("option", {value: v}, label)));
  el.value = value;
  return el;
}

export function createControls(section, ctx) {
  const usage = h("p", {class: "usage", id: "controls-usage", "aria-live": "polite"});

  // ---- eviction -----------------------------------------------------------------------------------
  const ev = {
    tier: select([["disk", "disk"], ["host", "host"], ["device", "device"]], "disk"),
    how: select([["bytes", "bytes to free"], ["fraction", "percent of what is there"], ["none", "no amount (namespace / age only)"]], "fraction"),
    amount: h("input", {type: "text", inputmode: "decimal", autocomplete: "off", value: "10"}),
    namespace: h("input", {type: "text", autocomplete: "off", spellcheck: "false"}),
    age: h("input", {type: "number", min: "0", step: "any", inputmode: "decimal"}),
    ageUnit: select(AGE_UNITS, "60"),
  };
  const evictMessage = h("div", {class: "confirm", id: "evict-result", "aria-live": "polite"});
  const selectors = h("div", {class: "fields"}, field("Namespace", ev.namespace, "blank: every namespace"),
    field("Last access older than", ev.age, "blank: any age"), field("Age unit", ev.ageUnit));
  const evictForm = h("form", {id: "evict-form", onsubmit: (event) => { event.preventDefault(); preview(); },
                               oninput: () => fill(evictMessage), onchange: () => { syncEvict(); fill(evictMessage); }},
    h("fieldset", {}, h("legend", {}, "Evict"),
      h("div", {class: "fields"}, field("Tier", ev.tier), field("Amount as", ev.how),
        field("Amount", ev.amount, "bytes: e.g. 500 MB; percent: 1-100")),
      selectors,
      h("div", {class: "buttons"}, h("button", {type: "submit"}, "Preview (dry run)")),
      evictMessage));

  function syncEvict() {
    ev.amount.disabled = ev.how.value === "none";
  }

  function evictBody() {
    const body = {tier: ev.tier.value};
    if (ev.how.value === "bytes") {
      body.bytes_to_free = parseBytes(ev.amount.value);
      if (body.bytes_to_free === null) throw new Error("Amount: give a size to free, e.g. 500 MB");
    } else if (ev.how.value === "fraction") {
      const percent = Number(ev.amount.value);
      if (!ev.amount.value.trim() || !(percent > 0 && percent <= 100)) throw new Error("Amount: give a percent between 0 and 100");
      body.fraction = percent / 100;
    }
    if (ev.namespace.value.trim()) body.namespace = ev.namespace.value.trim();
    if (ev.age.value !== "") body.older_than_s = Number(ev.age.value) * Number(ev.ageUnit.value);
    return body;
  }

  function describe(r) {
    const what = r.tier === "disk" ? `${num(r.num_chunks)} chunk(s)` : `${num(r.num_pages)} page(s)`;
    return `${what}, ${bytes(r.num_bytes)}` + (r.skipped_pinned ? `; ${num(r.skipped_pinned)} pinned kept` : "") +
      (r.skipped_locked ? `; ${num(r.skipped_locked)} locked page(s) kept` : "") +
      (r.is_complete ? "" : "; more remain (at most max_chunks per call): run it again");
  }

  async function preview() {
    let body;
    try {
      body = evictBody();
    } catch (error) {
      fill(evictMessage, h("p", {}, error.message));
      return;
    }
    const r = await api.post("evict", {...body, dry_run: true}).catch(api.handled);
    if (!r) return fill(evictMessage, h("p", {}, "Nothing was evicted (see the error above)."));
    const nothing = r.tier === "disk" ? !r.num_chunks : !r.num_pages;
    const confirm = h("button", {type: "button", class: "danger", id: "evict-confirm", onclick: async () => {
      confirm.disabled = true;
      const done = await api.post("evict", {...body, dry_run: false}).catch(api.handled);
      fill(evictMessage, h("p", {}, done ? `Evicted ${describe(done)}.` : "The eviction failed (see the error above)."));
      refreshUsage();
    }}, `Confirm: evict from ${r.tier}`);
    fill(evictMessage, h("p", {id: "evict-preview"}, `Dry run: ${nothing ? "nothing would be evicted" : `would evict ${describe(r)}`}.`),
      nothing ? null : h("div", {class: "buttons"}, confirm,
        h("button", {type: "button", class: "secondary", onclick: () => fill(evictMessage)}, "Cancel")));
    if (!nothing) confirm.focus();
  }

  // ---- flush and clear ----------------------------------------------------------------------------
  const flushMessage = h("p", {class: "result", "aria-live": "polite"});
  const flushButton = h("button", {type: "button", onclick: async () => {
    flushButton.disabled = true;
    fill(flushMessage, "Flushing…");
    const r = await api.post("flush").catch(api.handled);
    flushButton.disabled = false;
    fill(flushMessage, r ? `Flushed: ${num(r.persisted_pages)} page(s) on disk, ${num(r.failed_pages)} failed.`
      : "The flush failed (see the error above).");
    refreshUsage();
  }}, "Flush memory tiers to disk");
  const clearTier = select([["device", "device"], ["host", "host"], ["disk", "disk"], ["all", "all tiers"]], "device");
  const clearMessage = h("div", {class: "confirm", "aria-live": "polite"});
  const clearForm = h("form", {onsubmit: (event) => {
    event.preventDefault();
    const tier = clearTier.value;
    const yes = h("button", {type: "button", class: "danger", onclick: async () => {
      yes.disabled = true;
      const r = await api.post("clear", {tier, confirm: true}).catch(api.handled);
      fill(clearMessage, h("p", {}, r ? `Removed ${Object.entries(r.removed).map(([k, v]) => `${k} ${num(v)}`).join(", ")}; ` +
        `remaining ${Object.entries(r.remaining).map(([k, v]) => `${k} ${num(v)}`).join(", ")}.` : "Clear failed (see the error above)."));
      refreshUsage();
    }}, `Yes, clear ${tier}`);
    fill(clearMessage, h("p", {}, `Clearing ${tier} removes every unlocked page there` +
      (tier === "disk" || tier === "all" ? ", and every chunk on disk, pinned ones included" : "") + ". Sure?"),
    h("div", {class: "buttons"}, yes, h("button", {type: "button", class: "secondary", onclick: () => fill(clearMessage)}, "Cancel")));
    yes.focus();
  }, onchange: () => fill(clearMessage)},
  h("fieldset", {}, h("legend", {}, "Clear"), field("Tier", clearTier),
    h("div", {class: "buttons"}, h("button", {type: "submit"}, "Clear…")), clearMessage));

  // ---- jobs ---------------------------------------------------------------------------------------
  const repair = h("input", {type: "checkbox"});
  const purge = h("input", {type: "checkbox"});
  const gcSize = h("input", {type: "text", inputmode: "decimal", autocomplete: "off", placeholder: "e.g. 5 GB"});
  const jobMessage = h("p", {class: "result", "aria-live": "polite"});
  const jobBox = h("div", {id: "job-progress", "aria-live": "polite"});
  const jobList = h("div", {id: "job-list"});

  async function start(kind, body) {
    fill(jobMessage);
    const job = await api.post(`jobs/${kind}`, body).catch(api.handled);
    if (job) follow(job);
  }

  function renderJob(job) {
    const fraction = job.progress.fraction;
    const bar = h("progress", {max: "1", id: `job-bar-${job.id}`, "aria-label": `${job.kind} progress`});
    if (fraction !== null) bar.value = fraction;  // without a value: indeterminate (total unknown)
    const result = job.result ? dl(Object.entries(job.result).map(([k, v]) => [k.replaceAll("_", " "), num(v)]),
      {class: "job-result"}) : null;
    return h("div", {class: "job", dataset: {state: job.state, kind: job.kind}, id: `job-${job.id}`},
      h("h4", {}, `${job.kind} · `, h("span", {class: "state"}, job.state)),
      bar, h("span", {class: "progress-text"}, ` ${num(job.progress.done)}` +
        (job.progress.total !== null ? ` of ${num(job.progress.total)}` : "") + (fraction !== null ? ` (${pct(fraction, 0)})` : "")),
      job.error ? h("p", {class: "error-text"}, `Failed: ${job.error}`) : null, result);
  }

  async function follow(job) {
    for (;;) {
      fill(jobBox, renderJob(job));
      if (job.state !== "running") break;
      await new Promise((resolve) => setTimeout(resolve, 400));
      const latest = await api.get(`jobs/${job.id}`).catch(api.handled);
      if (!latest) return;
      job = latest;
    }
    loadJobs();
    refreshUsage();
  }

  async function loadJobs() {
    const jobs = await api.get("jobs").catch(api.handled);
    if (!jobs) return;
    const rows = jobs.items.slice().reverse().map((j) => [j.kind, j.state, when(j.created_at),
      j.finished_at ? seconds(j.finished_at - j.created_at) : "running",
      j.error || (j.result ? Object.entries(j.result).map(([k, v]) => `${k.replaceAll("_", " ")} ${num(v)}`).join(", ") : "—")]);
    fill(jobList, rows.length ? table("Recent jobs", ["job", "state", "started", "took", "result"], rows, {class: "stack"}) : null);
  }

  const rebuildButton = h("button", {type: "button", id: "start-rebuild", onclick: () => start("rebuild", {})}, "Start rebuild");
  const jobs = h("fieldset", {}, h("legend", {}, "Maintenance jobs"),
    h("div", {class: "job-starts"},
      h("div", {}, h("label", {class: "check"}, repair, " repair (quarantine corrupt files, adopt orphans)"),
        h("button", {type: "button", id: "start-verify", onclick: () => start("verify", {repair: repair.checked})}, "Start verify")),
      h("div", {}, h("p", {class: "hint"}, "Rebuild re-indexes every chunk file: offline stores only (chunkstore admin)."),
        rebuildButton),
      h("div", {}, h("label", {class: "check"}, purge, " delete quarantined files"),
        field("Evict down to (optional)", gcSize),
        h("button", {type: "button", id: "start-gc", onclick: () => {
          let size;
          try {
            size = parseBytes(gcSize.value);
          } catch (error) {
            fill(jobMessage, error.message);
            return;
          }
          start("gc", size === null ? {purge_quarantine: purge.checked} : {purge_quarantine: purge.checked, disk_size_bytes: size});
        }}, "Start gc"))),
    jobMessage, jobBox, jobList);

  async function refreshUsage() {
    const st = await api.get("stats").catch(api.handled);
    if (!st) return;
    fill(usage, "Now: ", st.tiers.map((t, i) => [i ? " · " : "",
      h("span", {dataset: {tier: t.name, usedBytes: String(t.used_bytes)}},
        `${t.name} ${bytes(t.used_bytes)}${t.capacity_bytes ? ` of ${bytes(t.capacity_bytes)}` : ""}` +
        (t.num_chunks !== null && t.num_chunks !== undefined ? ` (${num(t.num_chunks)} chunks)` : ""))]));
  }

  fill(section, h("h2", {tabindex: "-1"}, "Controls"), usage, evictForm,
    h("div", {class: "grid2"}, h("fieldset", {}, h("legend", {}, "Flush"),
      h("p", {class: "hint"}, "Writes every page the memory tiers hold down to disk and waits: before a planned restart."),
      h("div", {class: "buttons"}, flushButton), flushMessage), clearForm),
    jobs);
  syncEvict();

  return {
    show() {
      refreshUsage();
      loadJobs();
      // A live cache answers a rebuild with 409: say so before the click.
      ctx.getConfig().then((config) => {
        rebuildButton.disabled = config.backend === "cache";
        rebuildButton.title = rebuildButton.disabled ? "stop the server and use chunkstore admin" : "";
      }).catch(api.handled);
    },
    hide() {},
  };
}
