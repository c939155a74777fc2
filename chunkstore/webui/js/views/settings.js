// Settings: the effective configuration (GET /config) and a form for what this backend changes live
// (its `live_settings`, with the choices the OpenAPI spec gives for PATCH /config); only changed
// values are sent.

import * as api from "../api.js";
import {dl, field, fill, h} from "../dom.js";

function value(v) {
  if (v === null || v === undefined) return "—";
  if (Array.isArray(v)) return v.length ? v.map(value).join(", ") : "none";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "object") {
    const entries = Object.entries(v);
    return entries.length ? entries.map(([k, x]) => `${k} = ${value(x)}`).join(", ") : "none";
  }
  return String(v);
}

function group(title, obj) {
  if (!obj) return h("section", {}, h("h3", {}, title), h("p", {class: "hint"}, "None on this backend."));
  return h("section", {}, h("h3", {}, title),
    dl(Object.entries(obj).map(([k, v]) => [k, value(v)]), {class: "config", dataset: {group: title.toLowerCase()}}));
}

/** The PATCH /config body's field schemas from the OpenAPI spec: {name: {enum?, type, minimum, ...}}. */
async function patchFields() {
  const spec = await api.get("openapi.json");
  const schemas = spec.components.schemas;
  const resolve = (s) => (s && s.$ref ? schemas[s.$ref.split("/").pop()] : s);
  const out = {};
  for (const [name, prop] of Object.entries(schemas.ConfigPatch?.properties || {})) {
    const options = (prop.anyOf || [prop]).map(resolve).filter((s) => s && s.type !== "null");
    out[name] = {...(options[0] || {}), description: prop.description};
  }
  return out;
}

/** "one of lru, lfu" or "from 0 to 1" (the field's description, if the spec has one, first). */
function bounds(f) {
  const lower = f.minimum ?? f.exclusiveMinimum;
  const upper = f.maximum ?? f.exclusiveMaximum;
  const range = f.enum ? `one of ${f.enum.join(", ")}`
    : lower !== undefined && upper !== undefined ? `${f.exclusiveMinimum !== undefined ? "above" : "from"} ${lower} ` +
      `${f.exclusiveMaximum !== undefined ? "below" : "to"} ${upper}` : "";
  return [f.description, range].filter(Boolean).join("; ");
}

export function createSettings(section, ctx) {
  const view = h("div", {id: "settings-config"});
  const formBox = h("div", {id: "settings-form"});
  fill(section, h("h2", {tabindex: "-1"}, "Settings"), formBox, view);

  function current(config, name) {
    if (config.cache && name in config.cache) return config.cache[name];
    if (name === "disk_size" && config.store) return config.store.capacity_bytes === null ? null : config.store.capacity_bytes / 1e9;
    return null;
  }

  function renderForm(config, fields) {
    const controls = {};
    const message = h("p", {class: "result", "aria-live": "polite"});
    const items = config.live_settings.map((name) => {
      const f = fields[name] || {};
      const now = current(config, name);
      let control;
      if (f.enum) {
        control = h("select", {name}, f.enum.map((v) => h("option", {value: v}, v)));
        control.value = now ?? f.enum[0];
      } else {
        control = h("input", {name, type: "number", step: "any", inputmode: "decimal",
                              min: f.minimum ?? f.exclusiveMinimum, max: f.maximum ?? f.exclusiveMaximum,
                              value: now === null ? "" : String(now)});
      }
      controls[name] = {control, now};
      const hint = name === "disk_size" ? "GB (10^9 bytes) of stored chunks; blank: unbounded" : bounds(f);
      return field(name.replaceAll("_", " "), control, hint);
    });
    // Where the API keeps changes for the next start (GET /config's `persisted`), offer that too.
    const canPersist = Boolean(config.persisted && config.persisted.is_writable);
    const persist = h("input", {type: "checkbox", checked: canPersist, disabled: !canPersist});
    const form = h("form", {id: "config-form", onsubmit: async (event) => {
      event.preventDefault();
      const patch = {};
      for (const [name, {control, now}] of Object.entries(controls)) {
        const raw = control.value.trim();
        const v = control.tagName === "SELECT" ? raw : (raw === "" ? null : Number(raw));
        if (v !== now && !(v === null && now === null)) patch[name] = v;
      }
      if (!Object.keys(patch).length) {
        message.textContent = "Nothing changed.";
        return;
      }
      const query = config.persisted ? {persist: persist.checked} : {};
      const updated = await api.call("PATCH", "config", {body: patch, query}).catch(api.handled);
      if (updated) {
        ctx.config = Promise.resolve(updated);
        render(updated, fields);
        formBox.querySelector(".result").textContent = `Changed ${Object.keys(patch).join(", ")}` +
          (config.persisted && persist.checked ? " (now, and kept for the next start; flags and environment still win)."
            : " (this process only: a restart uses the flags and environment again).");
      } else {
        message.textContent = "Nothing was changed (see the error above).";
      }
    }},
    h("fieldset", {}, h("legend", {}, "Change live"),
      items.length ? h("div", {class: "fields"}, items) : h("p", {}, "Nothing can change live on this backend."),
      items.length && config.persisted ? h("label", {class: "check"}, persist, canPersist
        ? " keep for the next start (in the data folder)" : " keep for the next start: not possible here (no writable data folder)") : null,
      items.length ? h("div", {class: "buttons"}, h("button", {type: "submit"}, "Apply changes")) : null,
      message));
    fill(formBox, form);
  }

  function render(config, fields) {
    renderForm(config, fields);
    fill(view, h("p", {}, `Backend: ${config.backend === "cache" ? "live cache (chunkstore serve)" : "store on disk (chunkstore admin)"}`),
      h("div", {class: "grid2"}, group("Identity", config.identity), group("Cache", config.cache),
        group("Store", config.store), group("Admin", config.admin),
        config.persisted ? group("Kept for the next start", config.persisted) : null));
  }

  return {
    async show() {
      const [config, fields] = await Promise.all([ctx.getConfig(true), patchFields()]).catch((error) => {
        api.handled(error);
        return [null, null];
      });
      if (config) render(config, fields);
      else fill(view, h("p", {}, "The configuration could not be loaded (see the error above)."));
    },
    hide() {},
  };
}
