"""Closed sets of named choices (codecs, durability, policies, sources) as string enums.

Invariant: ``parse`` accepts exactly the members' values (any case, ``-`` for ``_``, surrounding
space ignored) and rejects anything else with an error that lists every valid value, so a
mistyped setting never falls through to a default.
"""

from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """A str enum whose ``parse`` names the valid values when it rejects one."""

    @classmethod
    def valid_values(cls) -> list[str]:
        return [member.value for member in cls]

    @classmethod
    def parse(cls, value: "str | Choice") -> "Choice":
        """The member named by ``value``; raises ValueError listing the valid values."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            normal = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == normal:
                    return member
        raise ValueError(f"unknown {cls.label()} {value!r}; valid values: {', '.join(cls.valid_values())}")

    @classmethod
    def label(cls) -> str:
        """A lower-case name for messages, e.g. 'write policy' for WritePolicy."""
        return "".join(f" {c.lower()}" if c.isupper() else c for c in cls.__name__).strip()

    def __str__(self) -> str:
        return self.value
