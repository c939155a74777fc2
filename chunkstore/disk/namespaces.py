"""What a namespace may be: the one check that every layer calls (the store's entry points, the
engine integrations' settings, the server's header and tenants, the management API's tokens).

Invariant: a namespace that passes ``check_namespace`` fits the chunk header (UTF-8, at most
MAX_NAMESPACE_BYTES, chunkfile.py), the index (text any database driver encodes) and the
management API's URLs (one path segment: no ``/``, not ``.`` or ``..``); it is 1-256 characters
with no control characters, so it prints on one line.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Any

from chunkstore.disk.chunkfile import MAX_NAMESPACE_BYTES

MAX_NAMESPACE_CHARS = 256  # at most 4 UTF-8 bytes each: always within MAX_NAMESPACE_BYTES
NAMESPACE_RULE = (f"a namespace is 1-{MAX_NAMESPACE_CHARS} characters of UTF-8 text without control characters "
                  "or '/', and not '.' or '..'")
_SHOWN_CHARS = 40  # of a refused namespace, in its message


class NamespaceError(ValueError):
    """A namespace that breaks NAMESPACE_RULE; the message names it (cut short) and the rule broken."""


def shown(namespace: Any) -> str:
    """``namespace`` for a message: its repr, cut after 40 characters (with its length then)."""
    if not isinstance(namespace, str):
        return f"{namespace!r:.{_SHOWN_CHARS}}"
    if len(namespace) <= _SHOWN_CHARS:
        return repr(namespace)
    return f"{namespace[:_SHOWN_CHARS]!r}... ({len(namespace)} characters)"


@functools.lru_cache(maxsize=4096)
def _broken_rule(namespace: str) -> str | None:
    """What is wrong with ``namespace`` (already known to be 1-256 characters), None when nothing.
    Cached: the store checks the namespaces of every read and write, and a process uses few."""
    if any(unicodedata.category(c) == "Cs" for c in namespace):
        return "it is not valid UTF-8 text (a lone surrogate)"
    if any(unicodedata.category(c) == "Cc" for c in namespace):
        return "it holds a control character (NUL, a newline, ...)"
    if "/" in namespace:
        return "it holds a '/' (the management API names a namespace as one URL path segment)"
    if namespace in (".", ".."):
        return "'.' and '..' are not names (a URL path segment of them is removed)"
    if len(namespace.encode()) > MAX_NAMESPACE_BYTES:  # unreachable at 256 characters; the format's own bound
        return f"it is longer than {MAX_NAMESPACE_BYTES} bytes as UTF-8"
    return None


def check_namespace(namespace: Any) -> str:
    """``namespace`` when it follows NAMESPACE_RULE. Raises NamespaceError (a ValueError) naming the
    namespace (cut short) and the rule it breaks."""
    if not isinstance(namespace, str):
        raise NamespaceError(f"namespace {shown(namespace)}: a namespace is text, not a {type(namespace).__name__}")
    if not 1 <= len(namespace) <= MAX_NAMESPACE_CHARS:
        why = "it is empty" if not namespace else f"it has {len(namespace)} characters"
        raise NamespaceError(f"namespace {shown(namespace)}: {why}; {NAMESPACE_RULE}")
    if (why := _broken_rule(namespace)) is not None:
        raise NamespaceError(f"namespace {shown(namespace)}: {why}; {NAMESPACE_RULE}")
    return namespace
