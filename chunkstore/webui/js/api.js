// The page's only way to the management API: its base path relative to the page (api/v1/), the token
// from this tab's session storage sent as `Authorization: Bearer` (never a cookie), and every failed
// call handed to the error listener before it is thrown, so none goes unseen.
// A call answered 401 asks for a token (the unauthorized listener: the token dialog) and is made again
// once the token differs from the one it was sent with; it fails (and is reported) only when the
// token stays the same. So the page calls without a token until a call says one is needed; sending
// the same call again is safe, as a call answered 401 has changed nothing on the server.

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

let unauthorizedListener = null;

/** ``fn(error)`` is called with a 401 ApiError before it is reported and returns a promise that settles
 * when the user has answered (the token may have changed); the call is then made again if it has.
 * Concurrent 401s may share one answer. */
export function onUnauthorized(fn) {
  unauthorizedListener = fn;
}

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || "",
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

async function parseFailure(response, method, path) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    if (body && body.error) ({code, message} = body.error);
    else if (body && body.detail) message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
  } catch {
    // not JSON: keep the status text
  }
  return new ApiError(response.status, code, message, method, path);
}

/** ``send()`` (a fetch with the token of now) until it answers other than 401, or answers 401 and the
 * user's answer leaves the token as it was: then the 401 is reported and thrown. */
async function authorized(send, method, path) {
  for (;;) {
    const sentWith = token.get();
    const response = await send();
    if (response.status !== 401) return response;
    const error = await parseFailure(response, method, path);
    // A token given meanwhile (to another call's question) is tried at once, without asking again.
    if (token.get() === sentWith && unauthorizedListener) await unauthorizedListener(error);
    if (token.get() === sentWith) throw report(error);
  }
}

/** One JSON call: ``call("POST", "evict", {body: {...}})``. Resolves to the parsed answer; rejects with a
 * reported ApiError. */
export async function call(method, path, {query, body, signal} = {}) {
  let response;
  try {
    response = await authorized(() => fetch(url(path, query), {
      method, signal, credentials: "omit", cache: "no-store",
      headers: headers(body === undefined ? {} : {"Content-Type": "application/json"}),
      body: body === undefined ? undefined : JSON.stringify(body),
    }), method, path);
  } catch (exc) {
    if (exc instanceof ApiError || exc.name === "AbortError") throw exc;
    throw report(new ApiError(0, "unreachable", `the server could not be reached (${exc.message})`, method, path));
  }
  if (!response.ok) throw report(await parseFailure(response, method, path));
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
    response = await authorized(() => fetch(url("events", query), {
      signal, credentials: "omit", cache: "no-store", headers: headers({Accept: "text/event-stream"}),
    }), "GET", "events");
  } catch (exc) {
    if (exc instanceof ApiError) throw exc;
    if (exc.name === "AbortError") return;
    throw report(new ApiError(0, "unreachable", `the event stream could not be opened (${exc.message})`, "GET", "events"));
  }
  if (!response.ok) throw report(await parseFailure(response, "GET", "events"));
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
