"""A shared tier's sweep: lapsed publish claims taken over, objects with neither row nor claim
deleted once old enough, and the bucket's listing counted for every server's stats.

Invariants: safe on any server at any time, beside puts and other sweeps: a key is claimed before
its object goes (no writer uploads it meanwhile, and a key with a row is never won), and an
object younger than the grace period (an upload whose row is about to be committed) is kept. The
listing's counts are kept in the index (``store_meta``), so no request lists the bucket.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING

from chunkstore.disk.results import BUCKET_LISTING_META, BucketListing, SweepResult, listing_text

if TYPE_CHECKING:
    from chunkstore.disk.shared_protocol import SharedProtocol

SWEEP_BATCH = 256  # keys claimed, listed or deleted per round trip


def sweep(shared: SharedProtocol, grace_s: float) -> SweepResult:
    """Sweep the tier ``shared`` publishes to (SharedProtocol: its index, bucket and claims)."""
    index, payloads = shared.index, shared.payloads
    lapsed = objects = listed = orphans = 0
    # No lock beyond the claims: each removal holds its key's claim, and a sweep that ran beside
    # another finds their keys claimed or gone.
    while stale := index.lapsed_claims(limit=SWEEP_BATCH):
        lapsed += len(stale)
        objects += shared.delete_claimed([k for k, _ in stale])
        if len(stale) < SWEEP_BATCH:
            break
    cutoff = time.time() - grace_s
    batch: list[bytes] = []
    for key in itertools.chain(payloads.keys(), [None]):
        if key is not None:
            batch.append(key)
        if batch and (key is None or len(batch) >= SWEEP_BATCH):
            stored = index.present(batch)
            unclaimed = [k for k in batch if k not in stored and k not in index.claimed(batch)]
            old = [k for k in unclaimed if (t := payloads.modified_at(k)) is not None and t < cutoff]
            deleted = shared.delete_claimed(old)
            objects += deleted
            listed += len(batch) - deleted
            orphans += len(unclaimed) - deleted
            batch = []
    listing = BucketListing(objects=listed, orphans=orphans, listed_at=time.time(), listed_by=index.server_name)
    index.set_meta(BUCKET_LISTING_META, listing_text(listing))
    return SweepResult(lapsed_claims=lapsed, objects_deleted=objects, listing=listing)
