"""The chunk index through PgBouncer in transaction pooling mode: every test of
tests/test_store_postgres.py (the store's contract tests on a PostgreSQL index, and what only a
database server has: migrations, a database claimed by one store, rebuild, a read-only view, the
one-statement autocommit lookups) runs again with its database reached through the pooler
(tests/conftest.py: ``pgbouncer``). Left out: the deadlock's victim run again, whose set-up polls
pg_stat_activity inside one transaction (PostgreSQL keeps that view's snapshot for the transaction,
so a first poll before the index waits never sees it wait); the pooler passes the deadlock error
through unchanged."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from tests import test_store_postgres
from tests.helpers.recollect import recollect

pytestmark = pytest.mark.slow  # the store's contract again, through a pooler: CI runs it, the fast subset does not


@pytest.fixture
def postgres_url(postgres_url, pgbouncer) -> str:
    """This test's fresh database (the suite's ``postgres_url``), through PgBouncer."""
    return pgbouncer.through(postgres_url)


def test_these_tests_reach_their_database_through_pgbouncer(postgres_url, pgbouncer):
    assert make_url(postgres_url).port == pgbouncer.port


recollect(test_store_postgres, globals(), leave_out=["test_a_write_chosen_as_a_deadlocks_victim_runs_again"])
