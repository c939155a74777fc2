"""A store's sealing, chosen once when it opens: PlainSealing (no key: chunks named by their public
chain keys, stored as they are) or Keyring (a master key: every chunk sealed and named by its
namespace's keys, sealing.py), over the index's ``seal_keys`` table and its ``store_meta`` marker.

Invariants: a store is sealed from its start or never (``seal_master_key_id`` in ``store_meta``,
set once while the store holds no chunk); a sealed store opens only with the master key the marker
names, an unsealed one only without a key (each refusal names the key ids involved); a sealed store
reads sealed chunks only (no downgrade), an unsealed one unsealed chunks only. A namespace's keys
are made by the first put into it (one row, the first writer's: a concurrent second adopts it)
and only while the marker names this process's master key, so a server left on a rotated key
makes no row the new key cannot open; a reader never makes keys (no key: nothing was stored). A
cached key is looked up again after KEY_RECHECK_S, so a server stops using a namespace's keys
that another process shredded within that time (its rows are gone at once, so nothing is read).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import LargeBinary, String, Float, bindparam, create_engine, exists, inspect, select
from sqlalchemy.exc import SQLAlchemyError

from chunkstore.disk.codec import CorruptChunkError
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.index_dialect import dialect_for
from chunkstore.disk.keys import PageRef
from chunkstore.disk.results import SealingWork
from chunkstore.disk.schema import seal_keys, store_meta
from chunkstore.disk.seal_keys import KeyProvider, MasterKey, SealKeyError
from chunkstore.disk.sealing import (AuthenticationError, NamespaceKeys, is_sealed, open_sealed, seal, sealed_key_id,
                                     store_binding, unwrap, wrap)

if TYPE_CHECKING:
    from chunkstore.disk.index import ChunkIndex

log = logging.getLogger(__name__)
SEAL_META = "seal_master_key_id"  # store_meta: the master key a sealed store's keys are wrapped by
KEY_RECHECK_S = 30.0  # a cached namespace key is looked up again after this long (a shred elsewhere)
NO_KEY_RECHECK_S = 2.0  # "no keys" is looked up again sooner (another server's first put makes them)


class _PlainNames:
    """An unsealed store's naming: a page is stored under its public chain key."""

    namespace = None

    @staticmethod
    def name(key: bytes) -> bytes:
        return key


class PlainSealing:
    """An unsealed store: pages are stored as they are, under their public chain keys."""

    is_sealed = False
    master_key_id: str | None = None

    def stored_pages(self, pages: Sequence[PageRef], create: bool = False) -> list[PageRef | None]:
        return list(pages)

    def names(self, namespace: str | None, keys: Sequence[bytes]) -> list[bytes | None]:
        return list(keys)

    def seal(self, page: PageRef, segments: list, size: int) -> tuple[list, int]:
        return segments, size

    def open(self, name: bytes, data: memoryview, namespace: str | None = None
             ) -> tuple[memoryview, _PlainNames]:
        if is_sealed(data):
            raise CorruptChunkError("a sealed chunk in an unsealed store")
        return data, _PlainNames()

    def forget(self, namespace: str) -> None:
        pass


class SealKeyTable:
    """The index's ``seal_keys`` rows and the store's seal marker (the index's connections, under
    its writer lock for writes)."""

    def __init__(self, index: ChunkIndex) -> None:
        self.index = index

    def marker(self) -> str | None:
        return self.index.get_meta(SEAL_META)

    def set_marker_once(self, master_key_id: str) -> str:
        """Set the marker unless one is there; returns the one that is."""
        with self.index.write_lock, self.index.engine.begin() as conn:
            conn.execute(self.index.dialect.insert(store_meta).values(name=SEAL_META, value=master_key_id)
                         .on_conflict_do_nothing())
            return conn.execute(select(store_meta.c.value).where(store_meta.c.name == SEAL_META)).scalar_one()

    def row(self, namespace: str):
        with self.index.engine.connect() as conn:
            return conn.execute(select(seal_keys).where(seal_keys.c.namespace == namespace)).first()

    def row_by_key_id(self, key_id: bytes):
        with self.index.engine.connect() as conn:
            return conn.execute(select(seal_keys).where(seal_keys.c.key_id == key_id)).first()

    def rows(self) -> list:
        with self.index.engine.connect() as conn:
            return list(conn.execute(select(seal_keys).order_by(seal_keys.c.namespace)))

    def has_rows(self) -> bool:
        with self.index.engine.connect() as conn:
            return conn.execute(select(seal_keys.c.namespace).limit(1)).first() is not None

    def add(self, namespace: str, key_id: bytes, master_key_id: str, wrapped: bytes):
        """Insert a namespace's row unless it has one, and only while the marker names
        ``master_key_id``; returns the namespace's row then (None: the marker names another key)."""
        marker_is_mine = exists().where(store_meta.c.name == SEAL_META, store_meta.c.value == master_key_id)
        values = select(bindparam("namespace", type_=String), bindparam("key_id", type_=LargeBinary),
                        bindparam("master_key_id", type_=String), bindparam("wrapped", type_=LargeBinary),
                        bindparam("created_at", type_=Float)).where(marker_is_mine)
        stmt = self.index.dialect.insert(seal_keys).from_select(
            ["namespace", "key_id", "master_key_id", "wrapped", "created_at"], values).on_conflict_do_nothing()
        with self.index.write_lock, self.index.engine.begin() as conn:
            conn.execute(stmt, {"namespace": namespace, "key_id": key_id, "master_key_id": master_key_id,
                                "wrapped": wrapped, "created_at": time.time()})
            return conn.execute(select(seal_keys).where(seal_keys.c.namespace == namespace)).first()

    def delete(self, namespace: str) -> bool:
        with self.index.write_lock, self.index.engine.begin() as conn:
            return conn.execute(seal_keys.delete().where(seal_keys.c.namespace == namespace)).rowcount > 0

    def rewrap(self, old: MasterKey, new: MasterKey) -> tuple[int, list[str]]:
        """Every row unwrapped by ``old`` and wrapped by ``new``, and the marker moved to ``new``,
        in one transaction; returns how many rows, and the namespaces whose row does not open with
        ``old`` (altered or forged rows: nothing they name can be read, and they are left as they
        are). Raises SealKeyError when ``old`` is not the store's key (nothing changes then)."""
        with self.index.write_lock, self.index.engine.begin() as conn:
            self.index.dialect.lock_table(conn, seal_keys.name)
            marker = conn.execute(select(store_meta.c.value).where(store_meta.c.name == SEAL_META)).scalar()
            if marker != old.key_id:
                raise SealKeyError(f"the store is sealed with master key id {marker}, not {old.key_id} "
                                   f"({old.source})")
            rewrapped, unopened = 0, []
            for row in conn.execute(select(seal_keys)).all():
                try:
                    keys = unwrap(old, row.namespace, bytes(row.key_id), bytes(row.wrapped))
                except SealKeyError:
                    unopened.append(row.namespace)
                    continue
                conn.execute(seal_keys.update().where(seal_keys.c.namespace == row.namespace)
                             .values(master_key_id=new.key_id, wrapped=wrap(new, keys)))
                rewrapped += 1
            conn.execute(store_meta.update().where(store_meta.c.name == SEAL_META).values(value=new.key_id))
        return rewrapped, sorted(unopened)


class Keyring:
    """A sealed store's keys: the master key, and each namespace's keys as the index holds them
    (unwrapped on first use, cached, looked up again after KEY_RECHECK_S; a namespace without keys
    is looked up again after NO_KEY_RECHECK_S). Thread-safe: the index is read outside the lock."""

    is_sealed = True

    def __init__(self, table: SealKeyTable, master: MasterKey, identity: ModelIdentity, *, writable: bool) -> None:
        self.table = table
        self.master = master
        self.binding = store_binding(identity)
        self.writable = writable
        self._lock = threading.Lock()
        # namespace -> (its keys, or None: it has none; when looked up)
        self._by_namespace: dict[str, tuple[NamespaceKeys | None, float]] = {}
        self._namespace_of: dict[bytes, str] = {}  # key id -> its namespace, for the keys cached above
        self._warned: dict[str, float] = {}  # namespace -> when its unusable key row was last logged
        self._work = _WorkCounts()

    @property
    def master_key_id(self) -> str:
        return self.master.key_id

    def _unwrap(self, row) -> NamespaceKeys:
        if row.master_key_id != self.master.key_id:
            raise SealKeyError(f"the keys of namespace {row.namespace!r} are wrapped by master key "
                               f"{row.master_key_id}, not this server's {self.master.key_id} (rotated: "
                               "restart the server with the new key)")
        return unwrap(self.master, row.namespace, bytes(row.key_id), bytes(row.wrapped))

    def _cached(self, namespace: str) -> tuple[NamespaceKeys | None, bool] | None:
        """(keys, fresh) of ``namespace`` from the cache, or None when never looked up."""
        with self._lock:
            entry = self._by_namespace.get(namespace)
        if entry is None:
            return None
        keys, at = entry
        return keys, time.monotonic() - at < (KEY_RECHECK_S if keys is not None else NO_KEY_RECHECK_S)

    def _remember(self, namespace: str, keys: NamespaceKeys | None) -> NamespaceKeys | None:
        with self._lock:
            self._drop(namespace)
            self._by_namespace[namespace] = (keys, time.monotonic())
            if keys is not None:
                self._namespace_of[keys.key_id] = namespace
        return keys

    def _drop(self, namespace: str) -> None:
        """Forget ``namespace``'s cached keys (under ``_lock``)."""
        old = self._by_namespace.pop(namespace, None)
        if old is not None and old[0] is not None:
            self._namespace_of.pop(old[0].key_id, None)

    def _from_row(self, namespace: str, row, cached: NamespaceKeys | None) -> NamespaceKeys | None:
        """The keys ``row`` holds: the cached ones while its key id is theirs (so a server left on a
        rotated master key keeps the keys it opened), else unwrapped. Raises SealKeyError."""
        if row is None:
            return None
        if cached is not None and bytes(row.key_id) == cached.key_id:
            return cached
        return self._unwrap(row)

    def keys_for(self, namespace: str, create: bool = False) -> NamespaceKeys | None:
        """The keys of ``namespace``; None when it has none (nothing of it is stored) unless
        ``create``, which makes them (a writer's first put). Raises SealKeyError when its row does
        not open with this master key, or the store's master key was rotated away from this
        one's before the namespace had keys; the index's DBAPIError when it does not answer."""
        seen = self._cached(namespace)
        if seen is not None and seen[1] and (seen[0] is not None or not create):
            return seen[0]
        row = self.table.row(namespace)
        if row is None and create and self.writable:
            new = NamespaceKeys.generate(namespace)
            row = self.table.add(namespace, new.key_id, self.master.key_id, wrap(self.master, new))
            if row is None:
                raise SealKeyError(f"the store's master key is no longer {self.master.key_id} (rotated: "
                                   f"restart with the new key); no key made for namespace {namespace!r}")
        return self._remember(namespace, self._from_row(namespace, row, seen[0] if seen else None))

    def keys_by_id(self, key_id: bytes) -> NamespaceKeys | None:
        """The keys whose id is ``key_id`` (a chunk's, read without its row: a rebuild, an orphan),
        looked up again as ``keys_for``'s; None when no namespace has them (shredded, or forged)."""
        with self._lock:
            ns = self._namespace_of.get(key_id)
            entry = self._by_namespace.get(ns) if ns is not None else None
            found = (ns, entry[0], entry[1]) if entry is not None and entry[0] is not None else None
        if found is not None and time.monotonic() - found[2] < KEY_RECHECK_S:
            return found[1]
        row = self.table.row_by_key_id(key_id)
        if row is None:
            if found is not None:
                self.forget(found[0])
            return None
        return self._remember(row.namespace, self._from_row(row.namespace, row, found[1] if found else None))

    def usable_keys(self, namespace: str, create: bool = False) -> NamespaceKeys | None:
        """``keys_for``, with a key row this server cannot open taken as no keys (its pages are
        misses, or fail to be written), logged at most once a minute per namespace: an altered or
        forged row, or a master key rotated away from this server's."""
        try:
            return self.keys_for(namespace, create)
        except SealKeyError as exc:
            now = time.monotonic()
            with self._lock:
                due = now - self._warned.get(namespace, -math.inf) >= 60.0
                if due:
                    self._warned[namespace] = now
            if due:
                log.error("security: the seal keys of namespace %r cannot be used; its pages are misses and are "
                          "not written: %s", namespace, exc)
            return None

    def forget(self, namespace: str) -> None:
        with self._lock:
            self._drop(namespace)

    def work(self) -> SealingWork:
        """What this keyring sealed, opened and named since the store opened, and its CPU."""
        return self._work.snapshot()

    # -- what the store calls --------------------------------------------------------------

    def stored_pages(self, pages: Sequence[PageRef], create: bool = False) -> list[PageRef | None]:
        """Each page as the store keeps it: under its stored name, its parent's too (its token ids
        and namespace as they are); None for a page whose namespace has no keys."""
        c0 = time.thread_time()
        keys_of: dict[str, NamespaceKeys | None] = {}
        out: list[PageRef | None] = []
        for p in pages:
            if p.namespace not in keys_of:
                keys_of[p.namespace] = self.usable_keys(p.namespace, create)
            keys = keys_of[p.namespace]
            out.append(None if keys is None else dataclasses.replace(p, key=keys.name(p.key),
                                                                     parent_key=keys.name(p.parent_key)))
        self._work.add("name", 2 * len(pages), 0, time.thread_time() - c0)
        return out

    def names(self, namespace: str | None, keys: Sequence[bytes]) -> list[bytes | None]:
        """The stored names of ``namespace``'s chain keys ``keys`` (None each when it has no keys);
        ``namespace`` None: ``keys`` are stored names already."""
        if namespace is None:
            return list(keys)
        c0 = time.thread_time()
        ns_keys = self.usable_keys(namespace)
        names = [None] * len(keys) if ns_keys is None else [ns_keys.name(k) for k in keys]
        self._work.add("name", len(keys), 0, time.thread_time() - c0)
        return names

    def seal(self, page: PageRef, segments: list, size: int) -> tuple[list, int]:
        """The sealed payload of the chunk file ``segments`` of the stored ``page``. Raises
        OSError when its namespace lost its keys meanwhile (a shred): the page fails."""
        c0 = time.thread_time()
        keys = self.usable_keys(page.namespace)
        if keys is None:
            raise OSError(f"namespace {page.namespace!r} has no usable seal key (shredded, or its key row does "
                          "not open)")
        sealed = seal(keys, page.key, self.binding, segments)
        self._work.add("seal", 1, size, time.thread_time() - c0)
        return sealed

    def open(self, name: bytes, data: memoryview, namespace: str | None = None
             ) -> tuple[memoryview, NamespaceKeys]:
        """The chunk file in the sealed payload ``data`` of ``name``, and the keys it opened with
        (those of ``namespace`` when given, else those its key id names). Raises
        AuthenticationError; SealKeyError when the keys' row does not open with this master key
        (then nothing is known of the chunk: a rotated key, or an altered row)."""
        c0 = time.thread_time()
        try:
            key_id = sealed_key_id(data)
            keys = self.keys_for(namespace) if namespace is not None else self.keys_by_id(key_id)
            if keys is None:
                raise AuthenticationError(f"sealed under key id {key_id.hex()}, which this store does not hold "
                                          "(a shredded namespace's, or forged)")
            return open_sealed(keys, name, self.binding, data), keys
        finally:
            self._work.add("open", 1, len(data), time.thread_time() - c0)


Sealing = PlainSealing | Keyring


class _WorkCounts:
    """A keyring's running counts (SealingWork), added to by every thread that seals, opens or names."""

    _FIELDS = {"seal": ("sealed_chunks", "sealed_bytes", "seal_cpu_s"),
               "open": ("opened_chunks", "opened_bytes", "open_cpu_s"),
               "name": ("named_keys", None, "name_cpu_s")}

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}

    def add(self, op: str, count: int, size_bytes: int, cpu_s: float) -> None:
        count_field, bytes_field, cpu_field = self._FIELDS[op]
        with self._lock:
            v = self._values
            v[count_field] = v.get(count_field, 0) + count
            v[cpu_field] = v.get(cpu_field, 0.0) + cpu_s
            if bytes_field is not None:
                v[bytes_field] = v.get(bytes_field, 0) + size_bytes

    def snapshot(self) -> SealingWork:
        with self._lock:
            return SealingWork(**self._values)


@dataclass(slots=True)
class SealState:
    """What a rebuild keeps of the index it drops: the seal marker and the wrapped keys (without
    them every sealed chunk would be unreadable). Opaque: nothing is unwrapped."""

    marker: str | None = None
    rows: list[dict] = field(default_factory=list)

    def restore(self, index: ChunkIndex) -> None:
        if self.marker is None and not self.rows:
            return
        with index.write_lock, index.engine.begin() as conn:
            if self.marker is not None:
                conn.execute(index.dialect.insert(store_meta).values(name=SEAL_META, value=self.marker)
                             .on_conflict_do_nothing())
            if self.rows:
                conn.execute(index.dialect.insert(seal_keys).on_conflict_do_nothing(), self.rows)


def carry_seal_state(url: str) -> SealState:
    """The seal marker and keys of the index at ``url``, before a rebuild drops it; nothing when
    there is no such index or it cannot be read (then a sealed store's chunks are lost with it:
    logged)."""
    path = dialect_for(url).path
    if path is not None and not path.is_file():
        return SealState()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            tables = inspect(conn)
            if not tables.has_table(store_meta.name):
                return SealState()
            marker = conn.execute(select(store_meta.c.value).where(store_meta.c.name == SEAL_META)).scalar()
            rows = [dict(r._mapping) for r in conn.execute(select(seal_keys))] \
                if tables.has_table(seal_keys.name) else []
            return SealState(marker, rows)
    except SQLAlchemyError as exc:
        log.warning("the index %s cannot be read (%s): if its store was sealed, its keys are lost with it and "
                    "its chunks will not be indexed again", dialect_for(url).name_shown, exc)
        return SealState()
    finally:
        engine.dispose()


def open_sealing(index: ChunkIndex, provider: KeyProvider | None, identity: ModelIdentity, *, read_only: bool,
                 where: str) -> Sealing:
    """The sealing of the store whose index is ``index`` (at ``where``, for messages), given its
    master key's ``provider`` (None: no key). Marks a new (empty) store sealed. Raises
    SealKeyError: a sealed store without its key or with another, a key for a store that holds
    unsealed chunks, or a key that cannot be read."""
    table = SealKeyTable(index)
    marker = table.marker()
    if provider is None:
        if marker is not None:
            raise SealKeyError(f"the store at {where} is sealed (master key id {marker}); open it with that key "
                               "(--seal-key PATH, $CHUNKSTORE_SEAL_KEY_FILE or $CHUNKSTORE_SEAL_KEY)")
        if table.has_rows():  # its marker gone (an altered index): still never opened as an unsealed store
            raise SealKeyError(f"the store at {where} holds seal keys but no seal marker (an altered index?); "
                               "open it with its key")
        return PlainSealing()
    master = provider.master_key()
    if marker is None:
        if index.count():
            raise SealKeyError(f"the store at {where} holds unsealed chunks; a store is sealed from its start, so "
                               f"seal a new one (another --disk-path or index), or open this one without a key")
        if not read_only:
            marker = table.set_marker_once(master.key_id)
    if marker is not None and marker != master.key_id:
        raise SealKeyError(f"the store at {where} is sealed with master key id {marker}; the key given "
                           f"({provider.source}) is {master.key_id}")
    return Keyring(table, master, identity, writable=not read_only)
