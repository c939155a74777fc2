"""The tier controller's policy choices as string enums, shared by the settings and the controller.

Invariants: each policy is one closed set of lower-case snake_case names; ``parse`` accepts exactly
those (any case, ``-`` for ``_``) and rejects anything else with an error that lists every valid
value, so a mistyped policy can never fall through to a default. No torch, no pydantic here.
(The eviction policy lives with the radix tree, in radix_policy.py, beside its priority functions.)
"""

from __future__ import annotations

from chunkstore.choices import Choice
from chunkstore.disk.codec import Codec


PolicyEnum = Choice  # the policies' base (see chunkstore/choices.py)


class WritePolicy(PolicyEnum):
    """When a page on the device is copied down to host memory and disk."""

    WRITE_THROUGH = "write_through"  # every new page, at once
    WRITE_THROUGH_SELECTIVE = "write_through_selective"  # once it has been hit N times
    WRITE_BACK = "write_back"  # only when it is evicted from the tier above


class PrefetchPolicy(PolicyEnum):
    """How long a request waits for disk->host prefetch before it is scheduled."""

    BEST_EFFORT = "best_effort"  # use what has landed, recompute the rest
    WAIT_COMPLETE = "wait_complete"  # wait for the whole prefetch
    TIMEOUT = "timeout"  # wait up to prefetch_timeout_s, then as best_effort


class Compression(PolicyEnum):
    """The disk tier's payload codec; ``auto`` picks per dtype (``zstd_split`` for 16-bit values)."""

    AUTO = "auto"
    NONE = "none"
    ZSTD = "zstd"
    ZSTD_SPLIT = "zstd_split"

    def codec_for(self, itemsize_bytes: int) -> Codec:
        """The store codec for values of ``itemsize_bytes`` bytes."""
        if self is Compression.AUTO:
            return Codec.default_for(itemsize_bytes)
        return Codec(self.value)
