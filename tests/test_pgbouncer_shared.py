"""A shared tier whose index is reached through PgBouncer in transaction pooling mode: the
two-server tests of tests/test_shared_tier.py (claims, lapsed claims taken over, racing publishers,
eviction across servers, the sweeper, the two-step commit) and those of
tests/test_shared_contract.py that exercise the index's locks and claims across servers (the
evictor lock and stale plans, quotas across servers, repair and quarantine under claims, readers
beside writers) run again, each server's store on the pooler (tests/conftest.py: ``pgbouncer``).
The tests marked slow stay with their own modules."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from tests import test_shared_contract, test_shared_tier
from tests.helpers.recollect import recollect

pytestmark = pytest.mark.slow  # the shared tier's tests again, through a pooler: CI runs it, the fast subset does not


@pytest.fixture
def postgres_url(postgres_url, pgbouncer) -> str:
    """This test's fresh database (the suite's ``postgres_url``), through PgBouncer."""
    return pgbouncer.through(postgres_url)


def test_these_tests_reach_their_database_through_pgbouncer(postgres_url, pgbouncer):
    assert make_url(postgres_url).port == pgbouncer.port


recollect(test_shared_tier, globals())
recollect(test_shared_contract, globals(), tests=[
    "test_a_damaged_object_found_by_another_server_is_quarantined_for_the_whole_tier",
    "test_a_lost_index_is_refused_and_the_cli_rebuilds_exactly_the_valid_objects",
    "test_a_row_without_its_object_is_reported_then_dropped",
    "test_writers_and_readers_on_two_servers_see_whole_pages_only",
    "test_a_read_racing_evict_and_restore_keeps_the_restored_chunk",
    "test_two_puts_of_one_key_on_one_server_store_it_once",
    "test_a_plan_made_stale_by_another_server_is_made_again_under_the_evictor_lock",
    "test_bulk_eviction_follows_the_plan_order",
    "test_a_quota_set_on_one_server_bounds_the_puts_of_another",
    "test_repair_racing_the_sweeper_on_another_server_leaves_no_row_without_its_object",
    "test_a_chunk_another_server_stores_again_while_a_read_drops_it_stays",
])
