// Building the page: elements from data (text only, never HTML from the API) and the figures' formats.
// Sizes and rates are shown in decimal units (B, kB, MB, GB, TB: powers of 1000, as the API and the
// settings count them), in the unit that keeps the shown mantissa below 1000.

/** h("button", {type: "button", onclick}, "text", child, ...): an element; null/false children are skipped. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name in el && typeof value !== "string") el[name] = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** Replaces the children of ``el``. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A definition list of [term, value] pairs. */
export function dl(pairs, attrs = {}) {
  return h("dl", attrs, pairs.map(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]));
}

/** A table with a caption; ``rows`` are arrays of cells (text or nodes); wrapped so it scrolls sideways on
 * phones, or (attrs.class "stack") shown there as one card per row, each cell labelled with its header. */
export function table(caption, headers, rows, attrs = {}) {
  return h("div", {class: "table-wrap"},
    h("table", attrs,
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, headers.map((x) => h("th", {scope: "col"}, x)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => h("td", {dataset: {label: headers[i]}}, c)))))));
}

const DECIMAL_UNITS = ["B", "kB", "MB", "GB", "TB", "PB"];

/** ``n`` in the largest decimal unit (powers of 1000, as the project's sizes) that keeps the mantissa,
 * rounded to 3 significant digits, below 1000: 999e6 -> "999 MB", 999.7e6 -> "1.00 GB" (never
 * "1.00e+3 MB"). Whole numbers of the first unit stay whole ("512 B"). */
function decimal(n, suffix) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  let value = Number(n);
  let unit = 0;
  while (unit < DECIMAL_UNITS.length - 1 && Math.abs(Number(value.toPrecision(3))) >= 1000) {
    value /= 1000;
    unit++;
  }
  const text = unit === 0 && Number.isInteger(value) ? String(value)
    : Math.abs(value) < 0.01 ? value.toFixed(2) : value.toPrecision(3);
  return `${text} ${DECIMAL_UNITS[unit]}${suffix}`;
}

/** 1234567 -> "1.23 MB", 1e9 -> "1.00 GB", 1.5e12 -> "1.50 TB" (powers of 10); null -> "—". */
export const bytes = (n) => decimal(n, "");

/** A transfer rate in bytes per second: 2.5e9 -> "2.50 GB/s" (powers of 10, as bytes()); null -> "—". */
export const bytesPerSecond = (n) => decimal(n, "/s");

const UNITS = {b: 1, kb: 1e3, k: 1e3, mb: 1e6, m: 1e6, gb: 1e9, g: 1e9, tb: 1e12, t: 1e12,
               kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40};

/** "10 GB", "512MiB", "4096" -> bytes (an integer); "" -> null. Throws Error naming what it accepts. */
export function parseBytes(text) {
  const s = String(text).trim();
  if (!s) return null;
  const m = /^(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)$/i.exec(s);
  const unit = m ? UNITS[(m[2] || "b").toLowerCase()] : undefined;
  if (!m || unit === undefined) throw new Error(`"${s}" is not a size: write e.g. 4096, 500 MB, 2 GB or 1.5 GiB`);
  return Math.round(Number(m[1]) * unit);
}

export function num(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return Number(n).toLocaleString("en-US", {maximumFractionDigits: digits, minimumFractionDigits: digits});
}

export function pct(x, digits = 1) {
  return x === null || x === undefined || Number.isNaN(x) ? "—" : `${(x * 100).toFixed(digits)} %`;
}

export function seconds(s) {
  if (s === null || s === undefined) return "—";
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

/** Epoch seconds -> local "2026-11-30 19:45:02". */
export function when(t) {
  if (t === null || t === undefined) return "—";
  const d = new Date(t * 1000);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A key shortened for tables; the full key stays in the title (and in the detail view). */
export function shortKey(key) {
  return key ? `${key.slice(0, 12)}…` : "—";
}

let nextId = 0;
/** A labelled form control: returns [label, control] with the label bound to the control's id. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = `f${++nextId}`;
  const hintEl = hint ? h("small", {class: "hint", id: `${control.id}-hint`}, hint) : null;
  if (hintEl) control.setAttribute("aria-describedby", hintEl.id);
  return h("div", {class: "field"}, h("label", {for: control.id}, labelText), control, hintEl);
}
