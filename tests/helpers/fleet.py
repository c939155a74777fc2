"""Several `chunkstore serve` processes on one shared tier, for the end-to-end tests of a fleet
(tests/server/test_fleet.py, tests/server/test_sealed_fleet.py): ``Fleet`` starts them over one
index and bucket, ``complete`` asks one for a greedy completion, ``cached`` and ``fed_pages`` read
its usage."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import create_engine, text

from chunkstore import ChunkStore
from chunkstore.disk import FileKeyProvider
from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig
from chunkstore.disk.store_folder import read_identity
from tests.helpers.server import PAGE_SIZE, ServeProcess

GREEDY = {"max_tokens": 16, "temperature": 0}


def complete(server: ServeProcess, prompt: str, namespace: str | None = None) -> dict:
    headers = {"X-Chunkstore-Namespace": namespace} if namespace else {}
    reply = server.client.post("/v1/completions", json={"prompt": prompt, **GREEDY}, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> dict:
    usage = reply["usage"]
    return {"total": usage["prompt_tokens_details"]["cached_tokens"], **usage["cached_tokens_details"]}


def fed_pages(reply: dict) -> int:
    usage = reply["usage"]
    return (usage["prompt_tokens"] + usage["completion_tokens"] - 1) // PAGE_SIZE


class Fleet:
    """Servers on one shared tier; ``start(name)`` runs `chunkstore serve` over ``<tmp>/<name>``."""

    def __init__(self, tmp_path, index_url: str, bucket_url: str, s3_env: dict[str, str],
                 seal_key: Path | None = None) -> None:
        self.tmp_path, self.index_url, self.bucket_url, self.s3_env = tmp_path, index_url, bucket_url, s3_env
        self.seal_key = seal_key  # every server's master key: a sealed tier
        self.started: list[ServeProcess] = []
        self._engine = create_engine(index_url)

    def start(self, name: str, *flags: str) -> ServeProcess:
        sealed = ("--seal-key", str(self.seal_key)) if self.seal_key is not None else ()
        proc = ServeProcess(self.tmp_path / name, self.tmp_path / f"{name}-{len(self.started)}.log",
                            "--index-url", self.index_url, "--object-store", self.bucket_url, *sealed, *flags,
                            env=self.s3_env)
        self.started.append(proc)
        return proc

    def rows(self) -> int:
        with self._engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM chunks")).scalar()

    def wait_for_rows(self, at_least: int, timeout_s: float = 30) -> int:
        deadline = time.monotonic() + timeout_s
        while (n := self.rows()) < at_least:
            assert time.monotonic() < deadline, f"{n} rows on the shared tier after {timeout_s} s, expected {at_least}"
            time.sleep(0.1)
        return n

    def open_store(self, name: str) -> ChunkStore:
        """Server ``name``'s store, opened read-only beside it."""
        folder = self.tmp_path / name
        config = ObjectStoreConfig(self.bucket_url, endpoint_url=self.s3_env["AWS_ENDPOINT_URL"],
                                   region=self.s3_env["AWS_REGION"], access_key_id=self.s3_env["AWS_ACCESS_KEY_ID"],
                                   secret_access_key=self.s3_env["AWS_SECRET_ACCESS_KEY"])
        return ChunkStore(folder, read_identity(folder), read_only=True, index_url=self.index_url,
                          payloads=ObjectPayloads(config),
                          seal_key=FileKeyProvider(self.seal_key) if self.seal_key is not None else None)

    def dispose(self) -> None:
        self._engine.dispose()

    def close(self) -> None:
        for proc in self.started:
            proc.stop()
        self.dispose()
