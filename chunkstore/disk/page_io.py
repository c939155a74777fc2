"""Pages to payloads and back: encoding a page tensor into a chunk file's segments, and loading
payloads into page tensors (reads on I/O threads, each decoded as soon as it lands) with full
verification.

Invariants: a page is only written into its destination once its payload verified (checksums,
key, and, given the page asked for or its index row, parent, tokens and namespace); a failed read
or a bad payload is reported as a FileCheck, never raised; every read buffer taken is given back,
whatever fails (a leaked one would leave later loads waiting forever). torch is imported only when
a tensor moves.
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING

import numpy as np
from sqlalchemy.exc import DBAPIError

from chunkstore.disk.chunkfile import (
    ChunkHeader,
    decode_chunk,
    encode_header,
    make_header,
    max_header_bytes,
)
from chunkstore.disk.codec import Codec, CorruptChunkError, encode, encode_into, thread_buffer
from chunkstore.disk.file_check import FileCheck
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.index import ChunkRow
from chunkstore.disk.keys import PageRef
from chunkstore.disk.keyring import PlainSealing, Sealing
from chunkstore.disk.payloads import PayloadStore, PayloadsUnavailable, ReadBuffers
from chunkstore.disk.seal_keys import SealKeyError
from chunkstore.disk.sealing import SEAL_OVERHEAD_BYTES, AuthenticationError
from chunkstore.priority import ThreadPriority, lower_this_thread

if TYPE_CHECKING:
    import torch


@functools.cache
def torch_dtypes() -> dict[str, "torch.dtype"]:
    """KV dtype name -> torch dtype, for the dtypes this torch has (imports torch on first use)."""
    import torch

    names = ("bfloat16", "float16", "float32", "uint8", "float8_e4m3fn", "float8_e5m2")
    return {name: getattr(torch, name) for name in names if hasattr(torch, name)}


def __getattr__(name: str):
    # ``TORCH_DTYPES`` stays importable (PEP 562) without importing torch with this module.
    if name == "TORCH_DTYPES":
        return torch_dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def page_tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """The bytes of a page as a 1-D uint8 numpy array (a view when ``t`` is a contiguous CPU tensor)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().view(torch.uint8).reshape(-1).numpy()


def page_arrays(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """The bytes of each page (``page_tensor_bytes``), taken on the calling thread in one pass
    before the pages go to a pool: each torch call drops and retakes the GIL, and a put's 16
    upload threads doing so for their own pages convoyed on it (0.50 against 0.44 ms of CPU per
    page, measured in one process). Pages that all live on one device come over in one copy."""
    import torch

    devices = {t.device for t in tensors}
    if len(devices) == 1 and next(iter(devices)).type != "cpu":
        return [page_tensor_bytes(t) for t in torch.stack([t.detach() for t in tensors]).to("cpu")]
    return [page_tensor_bytes(t) for t in tensors]


def encode_page(page: PageRef, raw: np.ndarray, identity: ModelIdentity, codec: Codec,
                zstd_level: int | None) -> tuple[list[bytes | memoryview], int]:
    """The segments of the chunk file of ``page`` and their total size in bytes; ``raw`` is the
    page's bytes (``page_tensor_bytes``). Compressed, the file is one segment, header and planes
    together, in this thread's buffer, valid until this thread encodes another page (a payload
    store's ``stage`` takes it before it returns), so a sealed store seals it in one call; codec
    none: the header, then ``raw`` itself."""
    def header(payload) -> bytes:
        return encode_header(make_header(page.key, page.parent_key, page.namespace, page.token_ids,
                                         identity.kv_dtype, identity.page_shape, codec, raw, payload))

    if codec is Codec.NONE:
        payload = encode(raw, identity.itemsize, codec, zstd_level)
        head = header(payload)
        return [head, *payload.segments], len(head) + payload.stored_size_bytes
    room = max_header_bytes(len(page.token_ids), identity.itemsize)
    buf = thread_buffer("chunk", room + raw.nbytes)
    payload = encode_into(raw, identity.itemsize, codec, buf[room:], zstd_level)
    head = header(payload)
    start = room - len(head)  # the header just before the planes, whose place did not depend on it
    buf[start:room] = np.frombuffer(head, dtype=np.uint8)
    size = len(head) + payload.stored_size_bytes
    return [memoryview(buf)[start:start + size]], size


def max_payload_bytes(identity: ModelIdentity) -> int:
    """The largest chunk file a page of ``identity`` can make (raw planes, per-token ids, a header,
    a seal and slack): reads refuse anything bigger."""
    return identity.page_size_bytes + 8 * identity.page_size + SEAL_OVERHEAD_BYTES + (64 << 10)


def check_matches(header: ChunkHeader, page: PageRef) -> None:
    """Raise CorruptChunkError unless ``header`` holds what ``page`` asks for."""
    if header.key != page.key:
        raise CorruptChunkError("file holds another key")
    if header.parent_key != page.parent_key:
        raise CorruptChunkError("parent key differs from the one asked for")
    if header.token_ids != tuple(page.token_ids):
        raise CorruptChunkError("token ids differ from the ones asked for")
    if header.namespace != page.namespace:
        raise CorruptChunkError("namespace differs from the one asked for")


class PageLoader:
    """Reads and verifies payloads: ``io_threads`` read (default 8), ``decode_threads`` decode
    (default one per core), all at ``priority``; a sealed store's are opened by its ``sealing``
    first (keyring.py). Thread-safe; ``close`` joins its threads."""

    def __init__(self, payloads: PayloadStore, identity: ModelIdentity, *, io_threads: int | None = None,
                 decode_threads: int | None = None, priority: ThreadPriority = ThreadPriority.NORMAL,
                 thread_name: str = "chunkstore", sealing: Sealing | None = None):
        self.payloads = payloads
        self.identity = identity
        self.sealing: Sealing = PlainSealing() if sealing is None else sealing
        self.max_payload_bytes = max_payload_bytes(identity)
        self.io_threads = io_threads or default_io_threads()
        lowered = {"initializer": lower_this_thread, "initargs": (ThreadPriority.parse(priority),)}
        self._io_pool = ThreadPoolExecutor(max_workers=self.io_threads, thread_name_prefix=f"{thread_name}-read",
                                           **lowered)
        # Reads may run this far ahead of decoding; each buffer holds one chunk file.
        self._read_buffers = ReadBuffers(4 * self.io_threads, self.max_payload_bytes)
        # Decoding is pure CPU: one thread per core (more only contend; measured 1.4-1.7 GB/s cold
        # loads with 2 decode threads here against 0.9-1.2 with 4).
        self.decode_threads = decode_threads or (os.cpu_count() or 2)
        self._decode_pool = ThreadPoolExecutor(max_workers=self.decode_threads,
                                               thread_name_prefix=f"{thread_name}-decode", **lowered)

    def close(self) -> None:
        self._io_pool.shutdown(wait=True)
        self._decode_pool.shutdown(wait=True)

    def load(self, jobs: Sequence[tuple[int, bytes, PageRef, torch.Tensor]]) -> dict[int, FileCheck]:
        """Read the payload each job names (its stored key: the page's own, or in a sealed store
        its stored name) and decode it into the job's tensor, checked against the job's page;
        returns what each job's check found, by job index. Reads run on the I/O threads and each is
        decoded as soon as it lands, so the disk stays busy while the cores decode."""
        reads = {self._io_pool.submit(self._read, name): (i, name, p, out) for i, name, p, out in jobs}
        statuses: dict[int, FileCheck] = {}
        decodes = {}
        handed_over: set = set()
        try:
            for fut in as_completed(reads):
                i, name, page, out = reads[fut]
                buf, view, failed = fut.result()
                handed_over.add(fut)
                if view is None:
                    statuses[i] = failed
                else:
                    decodes[i] = self._decode_pool.submit(self._decode, name, page, out, buf, view)
        except BaseException:
            # Give back the buffers of reads that never reached a decoder.
            for fut in reads:
                if fut not in handed_over and not fut.cancel() and fut.exception() is None:
                    buf, view, _ = fut.result()
                    if view is not None:
                        view.release()
                        self._read_buffers.release(buf)
            raise
        for i, fut in decodes.items():
            statuses[i] = fut.result()
        return statuses

    def _read(self, name: bytes) -> tuple[mmap.mmap | None, memoryview | None, FileCheck | None]:
        """(buffer, view, None) once read, or (None, None, what failed)."""
        buf = self._read_buffers.acquire()
        try:
            return buf, self.payloads.read(name, self.max_payload_bytes, buffer=buf), None
        except FileNotFoundError:
            failed = FileCheck.missing()
        except PayloadsUnavailable as exc:
            failed = FileCheck.unavailable(exc)
        except OSError as exc:
            failed = FileCheck.unreadable(exc)
        except BaseException:
            self._read_buffers.release(buf)
            raise
        self._read_buffers.release(buf)
        return None, None, failed

    def _decode(self, name: bytes, page: PageRef, out: torch.Tensor, buf: mmap.mmap, view: memoryview) -> FileCheck:
        try:
            if out.device.type == "cpu" and out.is_contiguous():
                return self.check(name, view, page, page_tensor_bytes(out))
            import torch

            tmp = torch.empty(self.identity.page_shape, dtype=out.dtype)
            check = self.check(name, view, page, page_tensor_bytes(tmp))
            if check.is_ok:
                out.copy_(tmp)
            return check
        finally:
            view.release()
            self._read_buffers.release(buf)

    def verify(self, key: bytes, page: PageRef | None = None, out: np.ndarray | None = None,
               row: ChunkRow | None = None) -> FileCheck:
        """Read and fully verify the payload of ``key`` (see ``check``) where it is of record (a
        bucket, not a local copy of it)."""
        try:
            data = self.payloads.origin.read(key, self.max_payload_bytes)
        except FileNotFoundError:
            return FileCheck.missing()
        except PayloadsUnavailable as exc:
            return FileCheck.unavailable(exc)
        except OSError as exc:
            return FileCheck.unreadable(exc)
        return self.check(key, data, page, out, row)

    def check(self, key: bytes, data: memoryview, page: PageRef | None = None, out: np.ndarray | None = None,
              row: ChunkRow | None = None) -> FileCheck:
        """Verify the payload ``data`` stored under ``key`` (and, given ``page`` or ``row``, that it
        holds what they say), decoding into ``out`` (a scratch buffer when None). In a sealed store
        it must open with the keys of the page's or row's namespace (else those its key id
        names), and ``key`` must be the stored name of the page it holds."""
        namespace = page.namespace if page is not None else row.namespace if row is not None else None
        try:
            chunk, names = self.sealing.open(key, data, namespace)
            header, _ = decode_chunk(chunk, out, self.identity.kv_dtype, self.identity.page_shape)
            if names.name(header.key) != key:
                raise CorruptChunkError("file holds another key")
            if names.namespace is not None and header.namespace != names.namespace:
                raise CorruptChunkError("namespace differs from the one its keys belong to")
            if page is not None:
                check_matches(header, page)
            parent_key = names.name(header.parent_key)
            if row is not None and (parent_key, header.namespace) != (row.parent_key, row.namespace):
                raise CorruptChunkError("parent key or namespace differs from the index row")
        except AuthenticationError as exc:
            return FileCheck.unauthentic(str(exc), len(data))
        except CorruptChunkError as exc:
            return FileCheck.corrupt(str(exc), len(data))
        except (SealKeyError, DBAPIError) as exc:  # a key row this server cannot open (a rotated master key),
            return FileCheck.unavailable(exc)  # or an index that does not answer: not known bad, nothing changes
        return FileCheck.ok(header, len(data), parent_key)


def default_io_threads() -> int:
    """Threads that read chunk files: enough reads in flight to keep a disk's queue full."""
    return 8
