"""One rule for a namespace (chunkstore/disk/namespaces.py), kept by the store's every entry point
that names one: each bad namespace is refused with a ValueError naming it (cut short) and the
rule, before anything reaches the index, so nothing is written, counted or listed under it.
(The engine integrations' settings and the server keep it too: tests/test_integration_settings.py,
tests/integrations/test_sglang.py, tests/server/test_namespaces.py.)"""

from __future__ import annotations

import pytest

from chunkstore import ChunkStore, chain_pages
from chunkstore.disk.eviction import EvictionSelection
from chunkstore.disk.index import ChunkQuery
from chunkstore.disk.keys import PageRef, encode_tokens, page_key, root_key
from chunkstore.disk.namespaces import MAX_NAMESPACE_CHARS, NamespaceError, check_namespace
from tests.helpers import TINY, kv_pages

# (namespace, what the message says)
BAD = [
    ("../..", "'/'"),
    ("a/b", "'/'"),
    (".", "'.' and '..'"),
    ("..", "'.' and '..'"),
    ("x" * (1 << 20), "1048576 characters"),
    ("x" * (MAX_NAMESPACE_CHARS + 1), "257 characters"),
    ("", "empty"),
    ("a\0b", "control character"),
    ("line\nbreak", "control character"),
    ("\x85next-line", "control character"),
    ("\ud800", "lone surrogate"),
    (b"bytes", "text, not a bytes"),
    (None, "text, not a NoneType"),
]
GOOD = ["default", "tenant-a", "salt-" + "0" * 24, "ü" * MAX_NAMESPACE_CHARS, "日本語", "a b", "..a", "key-1.2"]


@pytest.mark.parametrize("namespace, says", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_a_bad_namespace_is_refused_naming_it_and_the_rule(namespace, says):
    with pytest.raises(NamespaceError) as caught:
        check_namespace(namespace)
    message = str(caught.value)
    assert isinstance(caught.value, ValueError) and says in message
    assert message.startswith("namespace ") and len(message) < 400  # a 1 MB namespace is not printed whole
    if isinstance(namespace, str) and namespace:
        assert repr(namespace[:40])[:-1] in message
        assert "1-256 characters" in message


@pytest.mark.parametrize("namespace", GOOD)
def test_good_namespaces_pass_as_they_are(namespace):
    assert check_namespace(namespace) is namespace


def _page(namespace: str) -> PageRef:
    """A first page of ``namespace`` built by hand (chain_pages would fail on some bad ones first)."""
    tokens = tuple(range(TINY.page_size))
    try:
        parent = root_key(TINY, namespace)
    except (UnicodeEncodeError, AttributeError, TypeError):
        parent = bytes(32)
    return PageRef(page_key(parent, encode_tokens(tokens)), parent, tokens, namespace)


@pytest.fixture
def store(tmp_path):
    with ChunkStore(tmp_path / "s", TINY) as s:
        assert s.put(chain_pages(TINY, list(range(8))), kv_pages(TINY, 2)).ok
        yield s


@pytest.mark.parametrize("namespace", [ns for ns, _ in BAD if ns is not None],  # (None: "every namespace" there)
                         ids=[f"bad{i}" for i in range(len(BAD) - 1)])
def test_the_store_refuses_a_bad_namespace_at_every_entry_point(store, namespace):
    import torch

    page = _page(namespace)
    calls = {
        "put": lambda: store.put([page], kv_pages(TINY, 1)),
        "get": lambda: store.get([page]),
        "get_into": lambda: store.get_into([page], [torch.empty(TINY.page_shape, dtype=torch.bfloat16)]),
        "exists": lambda: store.exists([page.key], namespace=namespace),
        "longest_prefix": lambda: store.longest_prefix([page.key], namespace=namespace),
        "set_quota": lambda: store.set_quota(namespace, 10**6),
        "quota": lambda: store.quota(namespace),
        "stored_bytes": lambda: store.stored_bytes(namespace),
        "delete_namespace": lambda: store.delete_namespace(namespace),
        "plan_eviction": lambda: store.plan_eviction(EvictionSelection(namespace=namespace, bytes_to_free=1)),
        "list_chunks": lambda: store.list_chunks(ChunkQuery(namespace=namespace)),
        "count_chunks": lambda: store.count_chunks(ChunkQuery(namespace=namespace)),
    }
    for name, call in calls.items():
        with pytest.raises(NamespaceError, match="^namespace "):
            call()
            pytest.fail(f"{name} took namespace {namespace!r:.40}")
    store.flush()  # nothing was buffered under it (a lone surrogate here failed in the database before)
    assert [n.namespace for n in store.stats().namespaces] == ["default"]
    assert store.num_chunks() == 2


def test_a_good_namespace_works_at_every_entry_point(store):
    pages = chain_pages(TINY, list(range(8)), namespace="ü" * MAX_NAMESPACE_CHARS)
    assert store.put(pages, kv_pages(TINY, 2)).ok
    store.set_quota(pages[0].namespace, 10**6)
    assert store.quota(pages[0].namespace) == 10**6
    assert store.longest_prefix([p.key for p in pages], namespace=pages[0].namespace) == 2
    assert store.delete_namespace(pages[0].namespace).num_chunks == 2
