"""A sealed shared tier (`chunkstore serve --seal-key` on PostgreSQL and an S3 bucket: Ceph's RADOS
Gateway where it is installed, as in CI), attacked with the bucket's own credentials (boto3, the
servers' AWS_* settings) and with read access to the database, but no seal key:

- no object and no index row holds a tenant's prompt, as u8, u16 or u32, nor its namespace;
- object names computed from the right guess of a prompt match nothing;
- forged objects (re-encoded with valid checksums, truncated, swapped between keys and between
  tenants) are misses and quarantined, and a server answers exactly as without a cache;
- a shredded tenant reads nothing from the tier again, even from its old objects put back, and
  the other tenant is untouched.
"""

from __future__ import annotations

import struct
import uuid

import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from chunkstore import chain_pages
from chunkstore.disk.chunkfile import encode_header, make_header
from chunkstore.disk.codec import Codec, encode
from chunkstore.disk.store_folder import read_identity
from chunkstore.engine.tokenizer import ByteTokenizer
from chunkstore.cli import main as cli
from tests.helpers.fleet import Fleet, cached, complete, fed_pages
from tests.helpers.server import STORY

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset

PROMPT = "alice's private system prompt, never to leave her tenant: " + STORY * 2


@pytest.fixture
def fleet(tmp_path, postgres_url, shared_s3) -> Fleet:
    bucket = f"sealed-{uuid.uuid4().hex[:12]}"
    shared_s3.create_bucket(bucket)
    key = tmp_path / "seal.key"
    assert cli(["keys", "new", str(key)]) == 0
    f = Fleet(tmp_path, postgres_url, f"s3://{bucket}/tiny", shared_s3.aws_env(), seal_key=key)
    f.s3, f.bucket = shared_s3, bucket
    yield f
    f.close()


class Attacker:
    """Holds the bucket's keys (boto3, as the servers' AWS_* settings give them) and reads the
    database; no seal key."""

    def __init__(self, fleet: Fleet) -> None:
        self.client, self.bucket = fleet.s3.client(), fleet.bucket
        self.index_url = fleet.index_url

    def names(self) -> list[str]:
        found: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="tiny/chunks/"):
            found += [o["Key"] for o in page.get("Contents", [])]
        return found

    def get(self, name: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=name)["Body"].read()

    def put(self, name: str, body: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=name, Body=body)

    def index_bytes(self) -> list[bytes]:
        """Every value of every row of every table of the index, as bytes."""
        engine = create_engine(self.index_url)
        values: list[bytes] = []
        with engine.connect() as conn:
            tables = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
            for table in tables:
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    values += [v if isinstance(v, bytes) else str(v).encode() for v in row if v is not None]
        engine.dispose()
        return values


def _encodings(token_ids: list[int], size: int = 12) -> list[bytes]:
    """Runs of the prompt's ids as a reader would search for them: u8 (the byte tokenizer's ids are
    the text's bytes), u16 and u32 little-endian."""
    ids = token_ids[1:1 + size]  # after the BOS
    return [bytes(ids), struct.pack(f"<{size}H", *ids), struct.pack(f"<{size}I", *ids)]


# Tenants whose names an attacker searches the ciphertext for: long enough that random bytes do
# not hold them by chance (a 3-byte name turns up in a few MB of ciphertext about once in ten runs).
ALICE, BOB = "tenant-alice-5b1e0c", "tenant-bob-93d4a7"


def _delete(server, data_folder, path: str) -> httpx.Response:
    """DELETE ``path`` of the server's management API with its admin token."""
    token = (data_folder / "admin-token").read_text().strip()
    return server.client.delete(path, headers={"Authorization": f"Bearer {token}"})


def test_the_bucket_and_the_index_reveal_no_prompt_and_confirm_no_guess(fleet):
    a = fleet.start("a")
    first = complete(a, PROMPT, ALICE)
    complete(a, PROMPT, BOB)
    fleet.wait_for_rows(2 * fed_pages(first))
    attacker = Attacker(fleet)
    bodies = [attacker.get(n) for n in attacker.names()]
    assert len(bodies) == fleet.rows() > 0
    ids = ByteTokenizer().encode(PROMPT)
    for needle in _encodings(ids) + [ALICE.encode(), BOB.encode(), b"CSKVCHNK"]:
        assert not any(needle in body for body in bodies), needle
    for needle in _encodings(ids):
        assert not any(needle in value for value in attacker.index_bytes())
    # The right guess, hashed with the public scheme (the identity is no secret), names nothing.
    identity = read_identity(fleet.tmp_path / "a")
    names = set(attacker.names())
    for namespace in (ALICE, BOB, "default"):
        for page in chain_pages(identity, ids, namespace):
            assert not any(page.key.hex() in n for n in names)
    # The key's holder serves it: another server, warm from the bucket.
    on_b = complete(fleet.start("b"), PROMPT, ALICE)
    assert cached(on_b)["disk"] > 0 and on_b["choices"][0]["text"] == first["choices"][0]["text"]


def _reencoded(identity, ids: list[int], index: int) -> bytes:
    """What a forger with the project's own code makes: an unsealed chunk of zeroed KV for the
    page the guess names, with valid checksums."""
    page = chain_pages(identity, ids, "alice")[index]
    arr = np.zeros(identity.page_size_bytes, dtype=np.uint8)
    codec = Codec.default_for(identity.itemsize)
    payload = encode(arr, identity.itemsize, codec)
    header = make_header(page.key, page.parent_key, page.namespace, page.token_ids, identity.kv_dtype,
                         identity.page_shape, codec, arr, payload)
    return encode_header(header) + b"".join(bytes(s) for s in payload.segments)


@pytest.mark.parametrize("attack", ["reencoded", "truncated", "swapped"])
def test_forged_objects_are_misses_quarantined_and_the_answer_is_the_uncached_one(fleet, attack):
    a = fleet.start("a")
    first = complete(a, PROMPT, "alice")
    bob = complete(a, "bob's own prompt: " + STORY * 2, "bob")
    fleet.wait_for_rows(fed_pages(first) + fed_pages(bob))
    attacker = Attacker(fleet)
    names = sorted(attacker.names())
    bodies = {n: attacker.get(n) for n in names}
    identity = read_identity(fleet.tmp_path / "a")
    ids = ByteTokenizer().encode(PROMPT)
    for i, name in enumerate(names):  # every object of the tier, as the attacker cannot tell them apart
        if attack == "reencoded":
            forged = _reencoded(identity, ids, i % (len(ids) // identity.page_size))
        elif attack == "truncated":
            forged = bodies[name][: len(bodies[name]) // 2]
        else:  # each object gets the next one's body: other pages, and the other tenant's
            forged = bodies[names[(i + 1) % len(names)]]
        attacker.put(name, forged)
    b = fleet.start("b")  # empty memory and local copy: everything comes from the bucket
    reply = complete(b, PROMPT, "alice")
    assert cached(reply)["disk"] == 0
    assert reply["choices"][0]["text"] == first["choices"][0]["text"]  # as computed without a cache
    disk = b.client.get("/api/v1/stats").json()["disk"]
    assert disk["sealed"] and disk["auth_failures"] >= 1 and disk["quarantined"] >= 1
    assert "failed authentication" in b.output()


def test_a_shredded_tenant_reads_nothing_again_and_the_other_is_untouched(fleet):
    a = fleet.start("a")
    alice = complete(a, PROMPT, "alice")
    bob_prompt = "bob's own prompt: " + STORY * 2
    bob = complete(a, bob_prompt, "bob")
    fleet.wait_for_rows(fed_pages(alice) + fed_pages(bob))
    attacker = Attacker(fleet)
    before = {n: attacker.get(n) for n in attacker.names()}  # an old copy of the bucket
    reply = _delete(a, fleet.tmp_path / "a", "/api/v1/namespaces/alice?shred=true")
    assert reply.status_code == 200, reply.text
    assert reply.json()["key_destroyed"] and reply.json()["num_chunks"] == fed_pages(alice)
    b = fleet.start("b")
    again = complete(b, PROMPT, "alice")  # recomputed: new keys, new names
    assert cached(again)["total"] == 0 and again["choices"][0]["text"] == alice["choices"][0]["text"]
    assert cached(complete(b, bob_prompt, "bob"))["disk"] > 0  # bob's pages are as they were
    fleet.wait_for_rows(fed_pages(again) + fed_pages(bob))
    # The old objects put back: under their own names (no rows: never read), and over the new ones.
    new_names = [n for n in attacker.names() if n not in before]
    old_alice = [body for name, body in before.items() if name not in attacker.names()]
    assert new_names and old_alice
    for name, body in before.items():
        attacker.put(name, body)
    for i, name in enumerate(new_names):
        attacker.put(name, old_alice[i % len(old_alice)])
    c = fleet.start("c")
    replay = complete(c, PROMPT, "alice")
    assert cached(replay)["disk"] == 0 and replay["choices"][0]["text"] == alice["choices"][0]["text"]
