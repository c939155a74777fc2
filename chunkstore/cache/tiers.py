"""The tiers of the cache as one enum: device and host memory (slots in a pool), and disk (the store).

Invariants: every tier name that crosses a module boundary (stats, the radix tree, the admin
operations, the management API's backend) is a ``Tier`` member; it is a str enum, so it serialises
and compares as "device", "host", "disk" (the wire format); ``parse`` and ``parse_memory`` reject
anything else with an error that lists the valid names.
"""

from __future__ import annotations

from chunkstore.choices import Choice


class Tier(Choice):
    """Where a page's KV can be: in a memory pool (``is_memory``: the tree holds its slots) or on
    disk (found by key in the store, never by slot)."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"

    @property
    def is_memory(self) -> bool:
        return self is not Tier.DISK

    @classmethod
    def parse_memory(cls, value: "str | Tier") -> "Tier":
        """The memory tier named by ``value``; raises ValueError listing ``device, host`` for
        anything else (the disk tier included)."""
        try:
            tier = cls.parse(value)
        except ValueError:
            tier = None
        if tier is None or not tier.is_memory:
            raise ValueError(f"unknown memory tier {value!r}; valid values: "
                             f"{', '.join(t.value for t in MEMORY_TIERS)}")
        return tier


MEMORY_TIERS: tuple[Tier, ...] = (Tier.DEVICE, Tier.HOST)  # the tiers the tree holds slots for
ALL_TIERS: tuple[Tier, ...] = tuple(Tier)  # device, host, disk: where a hit can be found
