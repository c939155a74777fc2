// The dashboard's shell: the views behind the navigation (#overview, #namespaces, #chunks, #controls,
// #settings), the token dialog, and the error list, where every failed API call is shown until dismissed.
// Invariants: the page opens on its data with no question (on a loopback server without tenants reads
// need no token); the dialog comes up by itself only when a call answers 401, saying which call, and
// the calls waiting on it are made again with the token given (api.js), not by reloading the view;
// opened from the Token… button (or an error's "Enter token"), a new token reloads the current view.

import * as api from "./api.js";
import {h, fill, when} from "./dom.js";
import {createOverview} from "./views/overview.js";
import {createNamespaces} from "./views/namespaces.js";
import {createChunks} from "./views/chunks.js";
import {createControls} from "./views/controls.js";
import {createSettings} from "./views/settings.js";

const errorList = document.getElementById("errors");
const dialog = document.getElementById("token-dialog");
const tokenForm = document.getElementById("token-form");
const tokenInput = document.getElementById("token-input");
const tokenReason = document.getElementById("token-reason");
const authState = document.getElementById("auth-state");

// ---- errors ---------------------------------------------------------------------------------------

function explain(error) {
  const what = `${error.method} ${error.path}`;
  if (error.status === 401) return `Not signed in (401) on ${what}: ${error.message}. Enter the admin token.`;
  if (error.status === 403) return `Not allowed (403) on ${what}: ${error.message}. This token may not see or do this.`;
  if (error.status === 0) return `${what}: ${error.message}`;
  return `${what} failed (${error.status} ${error.code}): ${error.message}`;
}

function showError(error) {
  const text = explain(error);
  const last = errorList.firstElementChild;
  if (last && last.dataset.text === text) {
    const count = Number(last.dataset.count) + 1;
    last.dataset.count = String(count);
    last.querySelector(".count").textContent = ` (×${count})`;
    return;
  }
  const item = h("li", {class: "error", dataset: {text, count: "1", status: String(error.status)}},
    h("span", {class: "when"}, when(Date.now() / 1000).slice(11)), " ",
    h("span", {class: "message"}, text), h("span", {class: "count"}),
    error.status === 401 ? h("button", {type: "button", onclick: askForToken}, "Enter token") : null,
    h("button", {type: "button", class: "dismiss", "aria-label": "Dismiss this error",
                 onclick: () => { item.remove(); errorList.hidden = !errorList.children.length; }}, "Dismiss"));
  errorList.prepend(item);
  while (errorList.children.length > 8) errorList.lastElementChild.remove();
  errorList.hidden = false;
}

api.onError(showError);
// ApiErrors were shown when they happened; anything else is a fault of the page: show it too (and let
// the browser log it as well).
window.addEventListener("unhandledrejection", (event) => {
  if (event.reason instanceof api.ApiError) event.preventDefault();
  else showError({status: 0, method: "page", path: "", message: `a fault in the page: ${event.reason?.message || event.reason}`});
});
window.addEventListener("error", (event) => {
  showError({status: 0, method: "page", path: "", message: `a fault in the page: ${event.message}`});
});

// ---- token ----------------------------------------------------------------------------------------

function renderAuth() {
  authState.textContent = api.token.get() ? "Token: set (this tab)" : "No token";
}

// The calls that answered 401 and wait for the dialog's answer (one answer for all of them).
let waiting = null;
// The token the user last left as it was when a 401 asked (Escape, Cancel): a call sent with it that
// answers 401 later (one in flight meanwhile, a poll) fails at once instead of asking again.
let declined = null;

/** ``error``: the 401 that asks (its call is named in the dialog); none: opened by the user. */
function openTokenDialog(error = null) {
  tokenReason.hidden = !error;
  tokenReason.textContent = error ? `${error.method} ${error.path} answered 401: ${error.message.replace(/\.$/, "")}. ` +
    "Give the token and the call is made again." : "";
  tokenInput.value = api.token.get();
  if (!dialog.open) dialog.showModal();
  tokenInput.focus();
}

api.onUnauthorized((error) => {
  if (!waiting && declined === api.token.get()) return Promise.resolve();
  if (!waiting) {
    let answered;
    waiting = {promise: new Promise((resolve) => { answered = resolve; }), answered, token: api.token.get()};
    openTokenDialog(error);
  }
  return waiting.promise;
});

tokenForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const action = event.submitter?.value || "save";
  const before = api.token.get();
  if (action === "save") api.token.set(tokenInput.value);
  else api.token.clear();
  errorList.replaceChildren();
  errorList.hidden = true;
  const asked = waiting !== null;
  dialog.close();
  // Asked by a 401: those calls are made again by api.js; asked by the user: reload the view.
  if (!asked && current && api.token.get() !== before) route(false);
});

dialog.addEventListener("close", () => {
  // Every way out (a button, Escape) answers the waiting calls: made again if the token changed,
  // else failed with their 401 (listed with "Enter token").
  renderAuth();
  if (waiting) {
    if (api.token.get() === waiting.token) declined = waiting.token;
    waiting.answered();
    waiting = null;
  }
});

// Opened by the user: the next 401 may ask again.
function askForToken() {
  declined = null;
  openTokenDialog();
}

document.getElementById("token-button").addEventListener("click", askForToken);

// ---- views ----------------------------------------------------------------------------------------

const context = {
  navigate: (hash) => { window.location.hash = hash; },
  config: null,
  /** GET /config, once per page load (views that depend on the backend's kind use it). */
  async getConfig(refresh = false) {
    if (!this.config || refresh) this.config = api.get("config").catch((e) => { this.config = null; throw e; });
    return this.config;
  },
};

const views = {
  overview: createOverview(document.getElementById("view-overview"), context),
  namespaces: createNamespaces(document.getElementById("view-namespaces"), context),
  chunks: createChunks(document.getElementById("view-chunks"), context),
  controls: createControls(document.getElementById("view-controls"), context),
  settings: createSettings(document.getElementById("view-settings"), context),
};
let current = null;

function route(moveFocus) {
  const [name, query] = window.location.hash.slice(1).split("?");
  const id = views[name] ? name : "overview";
  if (current && current.id !== id) {
    current.view.hide();
    current.section.hidden = true;
  }
  for (const link of document.querySelectorAll("nav a[data-view]")) {
    if (link.dataset.view === id) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const section = document.getElementById(`view-${id}`);
  const params = new URLSearchParams(query || "");
  if (!current || current.id !== id) {
    current = {id, view: views[id], section};
    section.hidden = false;
    document.title = `${section.querySelector("h2").textContent} · chunkstore`;
  }
  current.view.show(params);
  if (moveFocus) section.querySelector("h2").focus();
}

window.addEventListener("hashchange", () => route(true));
renderAuth();
route(false);  // the data at once: a call that needs a token asks for it (api.onUnauthorized)
fill(document.getElementById("api-base"), api.API_BASE.pathname);
