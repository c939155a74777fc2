"""Sizes as people type them: the one parser behind every flag, setting and field that takes a size.

Invariants: ``K M G T`` (with or without ``B``) are decimal (10^3 ...), ``Ki Mi Gi Ti`` (with or
without ``B``) binary (2^10 ...), case-insensitive; a plain number is bytes; ``pages`` (or ``page``)
is accepted only where the caller allows it and must be a whole number; a size is positive; every
error names the accepted forms. The disk capacity (``disk_size``) is the one setting whose plain
number is not bytes but GB (10^9 bytes), as the management API and the settings file keep it in
GB; it takes the same units (``disk_size_gb``).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chunkstore.cache.layout import KVLayout

GB = 10**9
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
BYTE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
              "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20,
              "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}
PAGE_UNITS = ("page", "pages")
BYTE_EXAMPLES = "e.g. 500MB, 2GB, 64KiB, or a plain number of bytes"
SIZE_EXAMPLES = "e.g. 2GB, 512MiB, 1000pages, or a plain number of bytes"


@dataclass(frozen=True, slots=True)
class PoolSize:
    """A size as given: a number of bytes or a number of pages (exactly one is set)."""

    num_bytes: int | None = None
    num_pages: int | None = None

    @classmethod
    def parse(cls, text: Any, *, pages: bool = True) -> "PoolSize":
        """'2GB', '1.5GiB', '1000pages', '1048576' -> PoolSize (see the module doc). ``pages``:
        whether a page count is accepted. Raises ValueError naming the accepted forms."""
        if isinstance(text, int) and not isinstance(text, bool):
            text = str(text)
        m = _SIZE_RE.match(text) if isinstance(text, str) else None
        unit = m.group(2).lower() if m else ""
        page_unit = pages and unit in PAGE_UNITS
        if not m or (unit not in BYTE_UNITS and not page_unit):
            units = ", ".join([*(u for u in BYTE_UNITS if u), *(["pages"] if pages else [])])
            raise ValueError(f"not a size: {text!r} ({SIZE_EXAMPLES if pages else BYTE_EXAMPLES}; units: {units})")
        if page_unit:
            if not m.group(1).isdigit():
                raise ValueError(f"a page count must be a whole number, got {text!r}")
            size = cls(num_pages=int(m.group(1)))
        else:
            size = cls(num_bytes=int(float(m.group(1)) * BYTE_UNITS[unit]))
        if not (size.num_pages or size.num_bytes):
            raise ValueError(f"size must be positive, got {text!r}")
        return size

    def to_pages(self, layout: KVLayout) -> int:
        """Whole pages of ``layout`` in this size (bytes round down)."""
        if self.num_pages is not None:
            return self.num_pages
        return layout.pages_for_bytes(self.num_bytes)


def parse_bytes(text: Any) -> int:
    """A size in bytes ('500MB', '2GiB', '1048576'); pages are refused. Raises ValueError."""
    return PoolSize.parse(text, pages=False).num_bytes  # pages=False: always a byte count


def disk_size_gb(value: Any) -> Any:
    """A disk capacity in GB: a plain number is GB, a size with a unit ('500GB', '2TiB') is
    converted; anything else is returned as is for the caller's validation."""
    if isinstance(value, str) and value.strip() and not _is_number(value):
        return parse_bytes(value) / GB
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def argparse_type(parse):
    """An argparse type whose error message is ours (argparse hides a plain ValueError's text)."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


def gb_or_zero(text: str) -> float:
    """An argparse-ready size in GB that may be 0 ('0', '0.5', '500GB', '2TiB'). Raises ValueError."""
    value = disk_size_gb(text)
    try:
        gb = float(value)
    except ValueError:
        raise ValueError(f"not a size: {text!r} (a number of GB, or a size such as 500GB, 2TiB)") from None
    if gb < 0:
        raise ValueError(f"size must not be negative, got {text!r}")
    return gb


def positive_gb(text: str) -> float:
    """An argparse-ready disk capacity in GB ('500', '0.5', '500GB', '2TiB'). Raises ValueError."""
    gb = gb_or_zero(text)
    if gb <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return gb


def positive_gb_as_bytes(text: str) -> int:
    """``positive_gb`` as whole bytes: a store's capacity from a flag. Raises ValueError."""
    return int(positive_gb(text) * GB)
