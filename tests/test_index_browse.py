"""The index's read-only browsing helpers (list_chunks, count_chunks, child_keys, subtree,
by_last_access, children_counts) against a plain Python model of the same rows, on real SQLite
files in tmp_path (the last two on PostgreSQL too)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chunkstore.disk.index import ChunkIndex, ChunkOrder, ChunkQuery, ChunkRow, sqlite_url
from tests.helpers.eviction import make_rows

_SORT_KEY = {ChunkOrder.LAST_ACCESS: lambda r: r.last_access_at, ChunkOrder.HITS: lambda r: r.hit_count,
             ChunkOrder.SIZE: lambda r: r.stored_bytes, ChunkOrder.CREATED: lambda r: r.created_at}


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    rows = make_rows(7, 120)
    index = ChunkIndex(sqlite_url(tmp_path_factory.mktemp("index")))
    index.insert(rows)
    yield index, rows
    index.close()


queries = st.builds(
    ChunkQuery,
    namespace=st.sampled_from([None, "a", "b", "zz"]),
    pinned=st.sampled_from([None, True, False]),
    min_stored_bytes=st.sampled_from([None, 505, 510]),
    max_stored_bytes=st.sampled_from([None, 512, 500]),
    accessed_before=st.sampled_from([None, 10.0, 40.0]),
    accessed_after=st.sampled_from([None, 5.0, 30.0]),
)


def matches(r: ChunkRow, q: ChunkQuery) -> bool:
    return ((q.namespace is None or r.namespace == q.namespace) and (q.pinned is None or r.pinned == q.pinned)
            and (q.min_stored_bytes is None or r.stored_bytes >= q.min_stored_bytes)
            and (q.max_stored_bytes is None or r.stored_bytes <= q.max_stored_bytes)
            and (q.accessed_before is None or r.last_access_at < q.accessed_before)
            and (q.accessed_after is None or r.last_access_at >= q.accessed_after)
            and (q.keys is None or r.key in q.keys))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=queries, order=st.sampled_from(list(ChunkOrder)), descending=st.booleans(), limit=st.integers(1, 50),
       use_keys=st.booleans())
def test_paged_listing_matches_the_model(indexed, q, order, descending, limit, use_keys):
    index, rows = indexed
    if use_keys:
        q = dataclasses.replace(q, keys=frozenset(r.key for r in rows[::3]))
    want = sorted((r for r in rows if matches(r, q)), key=lambda r: (_SORT_KEY[order](r), r.key), reverse=descending)
    got, after = [], None
    while True:
        page = index.list_chunks(q, order=order, descending=descending, limit=limit, after=after)
        got += page
        if len(page) < limit:
            break
        after = (_SORT_KEY[order](page[-1]), page[-1].key)
    assert [r.key for r in got] == [r.key for r in want]
    assert index.count_chunks(q) == len(want)


def test_empty_key_set_matches_nothing(indexed):
    index, _ = indexed
    nothing = ChunkQuery(keys=frozenset())
    assert index.list_chunks(nothing) == [] and index.count_chunks(nothing) == 0


def test_children_and_subtree(indexed):
    index, rows = indexed
    by_key = {r.key: r for r in rows}
    children: dict[bytes, list[bytes]] = {}
    for r in rows:
        children.setdefault(r.parent_key, []).append(r.key)
    for r in rows[:20]:
        assert sorted(index.child_keys(r.key)) == sorted(children.get(r.key, []))

    def depth_of(key: bytes, top: bytes) -> int:
        d = 0
        while key != top:
            key, d = by_key[key].parent_key, d + 1
        return d

    top = max(rows, key=lambda r: len(children.get(r.key, [])))
    sub = index.subtree(top.key, 1000)
    members, stack = set(), [top.key]
    while stack:
        k = stack.pop()
        members.add(k)
        stack += children.get(k, [])
    assert {r.key for r, _ in sub} == members
    depths = [d for _, d in sub]
    assert depths == sorted(depths, reverse=True) and all(d == depth_of(r.key, top.key) for r, d in sub)
    assert len(index.subtree(top.key, 2)) == min(2, len(members)) and index.subtree(b"\0" * 32, 10) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_rows_by_last_access_page_through_the_unpinned_rows_with_their_children_counted(tmp_path, request, backend):
    """by_last_access: the unpinned rows by (last access, key), page after page from a cursor,
    within a namespace or all of them, each with its stored children counted (pinned ones too),
    by the query itself or, without, by children_counts."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else sqlite_url(tmp_path)
    rows = make_rows(11, 120)
    children: dict[bytes, int] = {}
    for r in rows:
        children[r.parent_key] = children.get(r.parent_key, 0) + 1
    index = ChunkIndex(url)
    try:
        index.insert(rows)
        for ns in (None, "b"):
            want = sorted((r for r in rows if not r.pinned and ns in (None, r.namespace)),
                          key=lambda r: (r.last_access_at, r.key))
            for count_children in (True, False):
                got, after = [], None
                while page := index.by_last_access(ns, after, 7, count_children=count_children):
                    got += page
                    after = (page[-1][0].last_access_at, page[-1][0].key)
                assert [row for row, _ in got] == want
                counts = ([n for _, n in got] if count_children
                          else [index.children_counts([r.key for r in want]).get(r.key, 0) for r in want])
                assert counts == [children.get(r.key, 0) for r in want]
        assert sum(n for n in children.values()) == len(rows) and any(n > 1 for n in children.values())
        assert index.children_counts([]) == {} and index.children_counts([b"\7" * 32]) == {}
    finally:
        index.close()


def test_listing_reads_a_read_only_index(tmp_path):
    index = ChunkIndex(sqlite_url(tmp_path))
    index.insert(make_rows(1, 10))
    index.close()
    ro = ChunkIndex(sqlite_url(tmp_path), read_only=True)
    try:
        assert ro.count_chunks(ChunkQuery(keys=frozenset(r.key for r in make_rows(1, 10)[:4]))) == 4
    finally:
        ro.close()
