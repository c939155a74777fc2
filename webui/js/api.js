// The page's only way to the management API: its base path relative to the page (api/v1/), the token
// from this tab's session storage sent as `Authorization: Bearer` (never a cookie), and every failed
// call handed to the error listener before it is thrown, so none goes unseen.

export const API_BASE = new URL("api/v1/", document.baseURI);
const TOKEN_KEY = "chunkstore.admin-token";

export class ApiError extends Error {
  constructor(status, code, message, method, path) {
    super(message);
    this.status = status;
    this.code = code;
    this.method = method;
    this.path = path;
  }
}

let errorListener = (error) => console.warn(error);

/** ``fn(error)`` is called with every ApiError (HTTP error or unreachable server). */
export function onError(fn) {
  errorListener = fn;
}

function report(error) {
  errorListener(error);
  return error;
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || "",
  /** Whether the user has answered the token question in this tab (a token, or none). */
  isChosen: () => sessionStorage.getItem(TOKEN_KEY) !== null,
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value.trim()),
  clear: () => sessionStorage.setItem(TOKEN_KEY, ""),
};

function headers(extra = {}) {
  const out = {Accept: "application/json", ...extra};
  const t = token.get();
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

function url(path, query) {
  const u = new URL(path, API_BASE);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") u.searchParams.set(name, String(value));
  }
  return u;
}

async function failure(response, method, path) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    if (body && body.error) ({code, message} = body.error);
    else if (body && body.detail) message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch {
    // not JSON: keep the status text
  }
  return report(new ApiError(response.status, code, message, method, path));
}

/** One JSON call: ``call("POST", "evict", {body: {...}})``. Resolves to the parsed answer; rejects with a
 * reported ApiError. */
export async function call(method, path, {query, body, signal} = {}) {
  let response;
  try {
    response = await fetch(url(path, query), {
      method, signal, credentials: "omit", cache: "no-store",
      headers: headers(body === undefined ? {} : {"Content-Type": "application/json"}),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (exc) {
    if (exc.name === "AbortError") throw exc;
    throw report(new ApiError(0, "unreachable", `the server could not be reached (${exc.message})`, method, path));
  }
  if (!response.ok) throw await failure(response, method, path);
  return response.status === 204 ? null : response.json();
}

/** For ``.catch``: an ApiError (already shown) or an abort becomes null; anything else is a fault of the
 * page and is thrown on (to the console and the page's error list), never swallowed. */
export function handled(error) {
  if (error instanceof ApiError || error?.name === "AbortError") return null;
  throw error;
}

export const get = (path, query, options = {}) => call("GET", path, {...options, query});
export const post = (path, body = {}) => call("POST", path, {body});

/** ``GET /events`` read with fetch (EventSource cannot send a header): yields {event, data} until the
 * server ends the stream or ``signal`` aborts it. */
export async function* events(query, signal) {
  let response;
  try {
    response = await fetch(url("events", query), {
      signal, credentials: "omit", cache: "no-store", headers: headers({Accept: "text/event-stream"}),
    });
  } catch (exc) {
    if (exc.name === "AbortError") return;
    throw report(new ApiError(0, "unreachable", `the event stream could not be opened (${exc.message})`, "GET", "events"));
  }
  if (!response.ok) throw await failure(response, "GET", "events");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let event = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        }
        if (data.length) yield {event, data: JSON.parse(data.join("\n"))};
      }
    }
  } catch (exc) {
    if (exc.name === "AbortError" || signal?.aborted) return;
    throw report(new ApiError(0, "stream", `the event stream broke off (${exc.message})`, "GET", "events"));
  } finally {
    reader.cancel().catch(() => {});
  }
}
