"""SharedProtocol: a shared tier's publish, eviction and clean-up, for payloads other servers
write too (a bucket whose ``shared_name`` every server names, beside one database index).

Invariants (the claim protocol): a key is claimed in the index (``chunk_claims``: one writer, an
expiry) before its object is uploaded, and its row replaces the claim in one statement only while
the claim is still this writer's; readers trust rows only. A key another writer claims is theirs
(a put skips it as a duplicate). Deletes claim the keys with the rows' deletion, then delete the
objects, then release the claims, so no writer uploads a key while its object goes; a reader
that found an object missing or bad deletes only the row it saw (``delete_unchanged``); one
evictor at a time fleet-wide (``evictor_lock``), and a plan is always made again under it (other
servers change the order unseen). A bounded put's row commit checks the room it leaves in its
own transaction (``index.insert_claimed`` with its limits: no two servers' commits take the last
room), and only a commit that found none takes the evictor lock, evicts and commits again. A
put's eviction deletes the objects it evicted after it lets go of the lock (the rows went under
it, and the keys stay claimed until their objects are gone): the fleet's one lock is not held
through the bucket's deletes.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.file_check import FileStatus
from chunkstore.disk.index import ChunkRow, NoRoomError, RoomLimits
from chunkstore.disk.keys import PageRef
from chunkstore.disk.payloads import PayloadsUnavailable, Staged
from chunkstore.disk.protocol import StoreProtocol, Todo, Written
from chunkstore.disk.results import (BUCKET_LISTING_META, PutResult, SharedTierStats, StoreStats, SweepResult,
                                     listing_of, server_stats)
from chunkstore.disk.sweep import sweep

# How long a shared tier's publish claim holds (index.claim): far longer than a batch's upload takes,
# short enough that a dead writer's keys are published by another server soon after.
CLAIM_TTL_S = 60.0
# A shared tier's uploads in flight at once (its write workers): an object store answers each PUT
# after a round trip, so its throughput grows with them (on this project's test machine, 16
# against 4 published a third faster, the raw PUTs as much).
SHARED_WRITE_WORKERS = 16
# How old an object with neither row nor claim must be before the sweeper deletes it.
SWEEP_GRACE_S = 600.0
# A shared tier's put pipelines its index work with its uploads (SharedProtocol.put): its first
# claim is of one page per write worker, so every upload thread starts after one short round trip,
# and its last commit this small, so little of the commit is left once the uploads end.
COMMIT_TAIL_PAGES = 32
# A bounded put that must evict frees room for about this many more puts of its size (at most a
# sixteenth of the capacity or quota, and nothing ahead for a put bigger than that), so most of
# the fleet's bounded puts find room, and commit without the evictor lock. A pass's plan costs
# the same however much it frees, and puts that find room do not wait for it: 32 held the lock
# 41% less per request than 8, with 14% fewer statements (bench fleet, N = 32, paired runs).
EVICT_AHEAD_PUTS = 32
EVICT_AHEAD_MAX_SHARE = 1 / 16
# A bounded put whose commit finds no room evicts and commits again under the evictor lock at
# most this many times (other servers' commits need not take that lock, so they can take the room
# an eviction made first); then its pages fail for want of room.
ROOM_TRIES = 3


class SharedProtocol(StoreProtocol):
    """The claim protocol over the store's index and bucket, as ``store.writer_id``."""

    is_shared = True
    write_step = "upload"
    replans_always = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._publishing = threading.local()  # .evicted: the keys a publish evicted, objects not yet deleted

    @property
    def writer_id(self) -> str:
        return self.store.writer_id

    @property
    def claim_ttl_s(self) -> float:
        return self.store.claim_ttl_s

    # -- the put path ------------------------------------------------------------------------

    def put(self, pages: Sequence[PageRef], arrays: Sequence[np.ndarray], originals: Sequence[PageRef],
            result: PutResult) -> PutResult:
        """Pipelined so that the index round trips overlap the uploads: the first keys, one per
        write worker, are claimed and their uploads started, the rest are claimed while those
        upload; the rows are committed in two steps, all but the last COMMIT_TAIL_PAGES pages
        while those still upload. Each step keeps the protocol: a key is claimed before it is
        uploaded, and its row goes in only after its upload. The claim leaves the stored keys out
        itself (no lookup before it)."""
        todo = self.todo(pages, arrays, originals, set(), result)
        keys = list(todo)
        futures: dict[bytes, Future] = {}
        claimed: list[bytes] = []
        committed: list[bytes] = []
        quotas: dict[str, int | None] = {}  # each namespace's, read once for the put (both commits)
        workers = self.store.num_workers
        try:
            parts = (keys[:workers], keys[workers:])
            for i, part in enumerate(parts):
                won = {k: todo[k] for k in part}
                if won and not self.claim(won, result):  # the index did not answer: those pages
                    rest = list(itertools.chain.from_iterable(parts[i + 1:]))  # failed, and so do the rest
                    self.count_failed(todo, rest, result, result.failed[part[0]])
                    break
                claimed += won
                futures.update(self.submit(won, self.encode_and_upload))
            order = [k for k in keys if k in futures]  # chain order: parents commit before children
            split = max(len(order) - COMMIT_TAIL_PAGES, 0)
            for part in (order[:split], order[split:]):
                if written := self.collect({k: futures[k] for k in part}, todo, result):
                    committed += self.publish(todo, written, result, quotas)
        finally:
            for fut in futures.values():
                fut.cancel()  # (an unexpected error: what was uploaded has no row, an orphan swept later)
            if unclaim := [k for k in claimed if k not in committed]:
                self.release_claims(unclaim)
        return result

    def encode_and_upload(self, page: PageRef, raw: np.ndarray, original: PageRef) -> tuple[Staged, int]:
        """A claimed page: encoded, then uploaded write-once (not yet indexed)."""
        staged, size = self.encode_and_stage(page, raw, original)
        self.payloads.publish([staged])
        return staged, size

    def claim(self, todo: Todo, result: PutResult) -> bool:
        """Claim the pages' keys before anything is written (``index.claim``); ``todo`` keeps the
        keys won, and a key another writer claims is skipped as a duplicate. Returns False, with
        every page failed, when the index cannot be reached."""
        try:
            mine = self.index.claim(list(todo), self.writer_id, self.claim_ttl_s)
        except DBAPIError as exc:
            for k in list(todo):
                result.failed[k] = f"write failed: index unavailable: {exc.orig}"
                self.index.count_event(todo.pop(k)[0].namespace, "write_errors")
            self.writes.failed("claim", exc, num_pages=len(result.failed))
            return False
        for key in [k for k in todo if k not in mine]:
            self.deduplicated(todo, key, result)
        return True

    def release_claims(self, keys: Sequence[bytes]) -> None:
        try:
            self.index.release(keys, self.writer_id)
        except DBAPIError as exc:  # they lapse after claim_ttl_s
            self.writes.failed("claim release", exc, num_pages=0)

    def bounded(self, quotas: dict[str, int | None]) -> bool:
        """A capacity or a namespace quota applies: another server's put between this one's room
        check and its row commit would take the room this one found (each would fit alone; both
        would not), so the commit checks the room (``commit_bounded``)."""
        if self.store.capacity_bytes is not None:
            return True
        return any(quota is not None for quota in quotas.values())

    def evict_ahead_bytes(self, need: int, limit: int) -> int:
        """Nothing for a put as big as a sixteenth of the limit (a small quota's: freeing part of a
        page's worth ahead would cost a whole page)."""
        most = int(limit * EVICT_AHEAD_MAX_SHARE)
        return min(EVICT_AHEAD_PUTS * need, most) if need <= most else 0

    def publish(self, todo: Todo, written, result: PutResult,
                quotas: dict[str, int | None] | None = None) -> list[bytes]:
        """As the store's, but the objects its eviction evicted are deleted once it has let go of
        the evictor lock (and the writer lock): their rows went under the lock, and their keys stay
        claimed by this writer until the objects are gone, so no writer uploads one meanwhile."""
        self._publishing.evicted = evicted = []
        try:
            return super().publish(todo, written, result, quotas)
        finally:
            self._publishing.evicted = None
            if evicted:
                self.delete_claimed_objects(evicted)

    def commit_bounded(self, todo: Todo, written: Written, result: PutResult,
                       quotas: dict[str, int | None]) -> list[bytes]:
        """First without the evictor lock: the rows are committed in a transaction that checks
        the room they leave (``index.insert_claimed`` with the limits), and most puts find room.
        One that does not was rolled back whole; it then evicts under the evictor lock and
        commits again, as often as ROOM_TRIES while other servers' puts take the room it made."""
        capacity = self.store.capacity_bytes
        self._publishing.room = RoomLimits(capacity, {ns: q for ns, q in quotas.items() if q is not None})
        try:
            try:
                return self.commit_within_room(todo, written, result, quotas, evict=False)
            except NoRoomError:
                pass
            for _ in range(ROOM_TRIES):
                left = {k: w for k, w in written.items() if k not in result.failed}
                if not left:
                    return []
                with self.index.evictor_lock():
                    try:
                        return self.commit_within_room(todo, left, result, quotas)
                    except NoRoomError:
                        continue
            for k, (staged, _) in written.items():
                if k not in result.failed:
                    self.reject(k, staged)
                    result.failed[k] = ("no room: other servers' puts took the room its evictions made, "
                                        f"{ROOM_TRIES} times")
            return []
        finally:
            self._publishing.room = None

    def publish_payloads(self, staged: list[Staged]) -> None:
        pass  # uploaded as they were encoded, under this writer's claims

    def commit_rows(self, rows: list[ChunkRow], todo: Todo, result: PutResult) -> list[bytes]:
        # The row replaces the claim; a bounded put's commit checks its room (commit_bounded).
        held = self.index.insert_claimed(rows, self.writer_id, getattr(self._publishing, "room", None))
        lost = [r.key for r in rows if r.key not in held]
        # A claim that lapsed while this put ran, and another took: the key is theirs now (its
        # object may be theirs too, or being deleted), so it is left alone.
        self.count_failed(todo, lost, result, "publish failed: the claim lapsed before the row was committed")
        return [r.key for r in rows if r.key in held]

    def reject(self, key: bytes, staged: Staged) -> None:
        super().reject(key, staged)
        try:  # uploaded already, under this writer's claim: it goes again
            self.payloads.delete(key)
        except PayloadsUnavailable:  # else an orphan, swept later
            pass

    # -- deletes -----------------------------------------------------------------------------

    def delete_rows_then_payloads(self, keys: list[bytes]) -> None:
        # Row first, then the object, with the keys claimed meanwhile so that no other writer
        # uploads one of them while its object is being deleted.
        self.index.delete_claiming(keys, self.writer_id, self.claim_ttl_s)
        evicted = getattr(self._publishing, "evicted", None)
        if evicted is not None:  # a put's eviction, under the evictor lock: after the lock (publish)
            evicted.extend(keys)
        else:
            self.delete_claimed_objects(keys)

    def delete_claimed_objects(self, keys: list[bytes]) -> None:
        """Delete the objects of ``keys`` (rows gone, keys claimed by this writer), then release
        the claims."""
        try:
            self.payloads.delete_many(keys)
        except OSError as exc:  # (unavailable, or refused) the claims lapse; the sweeper deletes the objects
            self.writes.failed("object delete", exc, num_pages=0)
        else:
            self.release_claims(keys)

    def delete_claimed(self, keys: Sequence[bytes]) -> int:
        """Claim ``keys`` (wins only unclaimed or lapsed ones, and never a key with a row), delete
        the objects of those won, release the claims; returns how many objects went."""
        won = list(self.index.claim(keys, self.writer_id, self.claim_ttl_s)) if keys else []
        if won:
            self.payloads.delete_many(won)
            self.release_claims(won)
        return len(won)

    # -- a read's clean-up and offline care ---------------------------------------------------

    def quarantine(self, key: bytes, page: PageRef | None, row: ChunkRow | None) -> str | None:
        """The object is checked again under a claim of this writer's (no other writer uploads the
        key while it moves), and only the row seen before the check goes (a chunk another server
        stored again since keeps its new row); an object with no row (an orphan) is claimed as a
        put would claim it."""
        seen = self.index.rows([key]).get(key)
        if seen is None:
            if key not in self.index.claim([key], self.writer_id, self.claim_ttl_s):
                return None  # another writer's put, eviction or sweep holds it
        try:
            check = self.store.verify_file(key, page, row=row)  # the bucket's object, not a local copy
            if check.is_ok:  # the bad bytes were a local copy's
                self.payloads.drop_copy(key)
                return None
            if check.status is FileStatus.UNAVAILABLE:  # unknown
                return None
            if seen is not None and not self.index.delete_unchanged({key: seen.created_at},
                                                                    (self.writer_id, self.claim_ttl_s)):
                return None
            return self.payloads.quarantine(key)
        finally:
            self.release_claims([key])

    def drop_missing(self, keys: Sequence[bytes]) -> int:
        with self.index.write_lock:
            seen = self.index.rows(keys)
            try:
                gone = [k for k in keys if k in seen and not self.payloads.exists(k)]
            except PayloadsUnavailable:  # asked again on a later miss
                return 0
            if not gone:
                return 0
            # Only the rows seen before the look at their objects: a chunk another server stored
            # again since keeps its new row.
            return len(self.index.delete_unchanged({k: seen[k].created_at for k in gone}))

    def adopt(self, rows: Sequence[ChunkRow]) -> int:
        """Under the protocol: a key another writer claims is left to it, and an object gone once
        claimed gets no row."""
        with self.index.write_lock:
            mine = self.index.claim([r.key for r in rows], self.writer_id, self.claim_ttl_s)
            try:
                there = [r for r in rows if r.key in mine and self.payloads.exists(r.key)]
                return len(self.index.insert_claimed(there, self.writer_id))
            finally:
                if mine:
                    self.release_claims(list(mine))

    def sweep(self, grace_s: float) -> SweepResult:
        return sweep(self, grace_s)

    def lapsed_claims(self, now: float | None, limit: int) -> list[tuple[bytes, str]]:
        return self.index.lapsed_claims(now, limit)

    def claimed_keys(self, keys: Sequence[bytes]) -> set[bytes]:
        return self.index.claimed(keys)

    def stats(self, stats: StoreStats) -> StoreStats:
        """The tier's figures with its claims, this server's read health and every server's
        counts, this one's first."""
        claims, lapsed = self.index.claim_counts()
        servers = server_stats(self.index.server_counts(), self.index.server_name, time.time())
        shared = SharedTierStats(payload_store=self.payloads.shared_name, index=self.index.name,
                                 writer_id=self.writer_id, claims=claims, lapsed_claims=lapsed,
                                 read_health=self.store._reads.health(), server_name=self.index.server_name,
                                 servers=servers, local_copy=self.payloads.local_copy_stats(),
                                 bucket=listing_of(self.index.get_meta(BUCKET_LISTING_META)),
                                 evictor_lock=self.index.evictor_lock_stats(),
                                 room_lock=self.index.room_lock_stats())
        return dataclasses.replace(stats, shared=shared)
