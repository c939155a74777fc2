"""Helpers of the crash tests (tests/test_crash.py, tests/helpers/shared_soak.py's jobs).

``die_in_the_first_migration``: make this process SIGKILL itself half way through the index's
first migration (on the second index revision 0001 creates), whatever the index's database.
Imports nothing of the store, so a ``python -c`` child may call it before anything else.
"""

from __future__ import annotations

import os
import signal


def die_in_the_first_migration() -> None:
    """Patch ``alembic.op.create_index`` so that its second call SIGKILLs this process (half way
    through revision 0001); the next open of the index finds a migration cut short."""
    import alembic.op

    real_create_index = alembic.op.create_index
    calls = []

    def create_index_then_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # half way through revision 0001
            os.kill(os.getpid(), signal.SIGKILL)
        return real_create_index(*args, **kwargs)

    alembic.op.create_index = create_index_then_die
