"""A minimal OpenAI chat-completions client for ``chunkstore bench multiturn --url`` (stdlib only).

Invariants: every request streams (server-sent events) so the time to first token is the time to
the first chunk that carries text; the usage comes from the last chunk (``stream_options.
include_usage``), the cached tokens from ``usage.prompt_tokens_details.cached_tokens`` and the
per-tier split from the ``usage.cached_tokens_details`` extension when the server sends it; one
connection per request, so any number of threads may call ``chat`` at once; the model name and
page size come from the server (``GET /get_model_info``), never assumed.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from chunkstore.bench.workload import Reply
from chunkstore.cache.stats import HIT_TIERS


class ServerError(RuntimeError):
    """The server could not be reached or answered something other than a chat completion."""


@dataclass(frozen=True, slots=True)
class ServerModel:
    """What ``GET /get_model_info`` says about the served model (SGLang's fields and chunkstore's)."""

    name: str  # what requests send as `model`
    page_size: int  # tokens per cache page: the granularity of the ideal hit rate
    model_id: str | None = None  # chunkstore's cache-key model id (names the weights)
    max_positions: int | None = None


class ChatClient:
    """Talks to ``url`` (``http://host:port``, optionally with a path prefix before ``/v1``)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 600.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url must look like http://127.0.0.1:8000, got {url!r}")
        self._scheme, self._host = parts.scheme, parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._api_key, self._timeout_s = api_key, timeout_s
        self.url = url

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self._timeout_s)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _get_json(self, path: str) -> dict:
        """The JSON object ``GET path`` answers. Raises ServerError when unreachable, not 200 or not JSON."""
        conn = self._connection()
        try:
            conn.request("GET", f"{self._prefix}{path}", headers=self._headers())
            resp = conn.getresponse()
            body = resp.read()
        except OSError as exc:
            raise ServerError(f"cannot reach {self.url}: {exc}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise ServerError(f"GET {path} answered {resp.status}: {body[:300]!r}")
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ServerError(f"GET {path} answered no JSON object: {body[:300]!r}")
        return doc

    def model_info(self) -> ServerModel:
        """The served model's name and page size from ``GET /get_model_info`` (SGLang's
        ``served_model_name`` and chunkstore's ``page_size``; SGLang's own server names its page
        size ``page_size`` in ``GET /get_server_info``, read as a fallback). Raises ServerError
        when the server does not say both."""
        info = self._get_json("/get_model_info")
        name = info.get("served_model_name") or info.get("model_path")
        page_size = info.get("page_size")
        if page_size is None:
            try:
                page_size = self._get_json("/get_server_info").get("page_size")
            except ServerError:
                page_size = None
        if not isinstance(name, str) or not name or isinstance(page_size, bool) or not isinstance(page_size, int) \
                or page_size < 1:
            raise ServerError(f"GET /get_model_info named no model and page size (served_model_name "
                              f"{name!r}, page_size {page_size!r})")
        max_positions = info.get("max_positions")
        return ServerModel(name, page_size, info.get("model_id"),
                           max_positions if isinstance(max_positions, int) else None)

    def chat(self, model: str, messages: Sequence[dict], *, max_tokens: int, user: str) -> Reply:
        """One streamed, greedy chat completion of exactly ``max_tokens`` tokens (``ignore_eos``).
        Raises ServerError for a failed request or a stream without usage."""
        payload = {"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "user": user}
        conn = self._connection()
        started = time.perf_counter()
        first_s: float | None = None
        text: list[str] = []
        usage = None
        try:
            conn.request("POST", f"{self._prefix}/v1/chat/completions", body=json.dumps(payload).encode(),
                         headers=self._headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise ServerError(f"POST /v1/chat/completions answered {resp.status}: {resp.read()[:300]!r}")
            while line := resp.readline():
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    raise ServerError(f"the stream failed: {chunk['error']}")
                for choice in chunk.get("choices") or ():
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        if first_s is None:
                            first_s = time.perf_counter()
                        text.append(delta)
                usage = chunk.get("usage") or usage
        except OSError as exc:
            raise ServerError(f"{self.url}: {exc}") from None
        finally:
            conn.close()
        done = time.perf_counter()
        if usage is None:
            raise ServerError("the stream carried no usage (the server must honour stream_options.include_usage)")
        details = usage.get("cached_tokens_details")
        tiers = {t: int(details.get(t, 0)) for t in HIT_TIERS} if isinstance(details, dict) else None
        return Reply(text="".join(text), output_ids=None, prompt_tokens=int(usage["prompt_tokens"]),
                     completion_tokens=int(usage.get("completion_tokens", 0)),
                     cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
                     tier_tokens=tiers, ttft_s=(first_s or done) - started, latency_s=done - started)
