"""AdminRuntime: everything one admin app holds (backend, settings, tokens, history, jobs, metrics).

Invariants: built by ``create_app`` (never at import time), kept in ``app.state.admin``, started
and closed by the app's lifespan (or the parent's, when mounted: see ``api.app.mount``); the
backend is the caller's and is never closed here; closing stops the sampler, asks jobs to stop
and ends event streams at their next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from chunkstore.api.backend.base import AdminBackend, BackendError
from chunkstore.api.history import HistorySampler, HistoryTable
from chunkstore.api.jobs import JobRunner
from chunkstore.api.metrics import AdminMetrics
from chunkstore.api.overrides import SettingsFile, shadowed
from chunkstore.api.security import AdminToken, TokenSource, allowed_host_names, is_loopback, resolve_tokens
from chunkstore.api.settings import AdminSettings
from chunkstore.http.hosts import HostRule

log = logging.getLogger(__name__)


class AdminRuntime:
    def __init__(self, backend: AdminBackend, settings: AdminSettings,
                 namespace_digests: Sequence[tuple[str, bytes]] = ()) -> None:
        """Raises ValueError when no admin token can be had, or the admin token is also a
        namespace's (see ``resolve_tokens``)."""
        self.backend, self.settings = backend, settings
        self.token: AdminToken = resolve_tokens(settings, backend.data_dir, namespace_digests)
        # Loopback is not trust: a reverse proxy on this host forwards `Host: 127.0.0.1`. With
        # tenants configured, anonymous reads would show one tenant's data to anybody.
        self.reads_need_token = not is_loopback(settings.host) or self.token.ring.has_namespace_tokens
        self.allowed_hosts = allowed_host_names(settings)
        self.host_rule = HostRule.of(self.allowed_hosts)
        self.history = HistoryTable(settings.history_max_rows)
        self._prepare_history()
        self.sampler = HistorySampler(backend, self.history, settings.history_interval_s)
        self.jobs = JobRunner(backend, self.history, keep=settings.job_history)
        self.metrics = AdminMetrics(backend)
        self.closing = threading.Event()
        self.settings_file = SettingsFile(backend.data_dir)
        self.explicit_settings = backend.explicit_settings()
        self.apply_persisted()
        if self.token.source is TokenSource.GENERATED:
            # INFO, not WARNING: a first start is normal (the token itself is never logged).
            log.info("generated an admin token into %s (mode 0600)", self.token.path)
        elif self.token.path is not None:
            log.info("admin token: %s", self.token.path)

    def _prepare_history(self) -> None:
        """The API's tables in the store's index database, made or upgraded as the API starts (a
        store that cannot be written, or none, is left to the sampler, which skips it)."""
        try:
            with self.backend.using_store(write=True) as store:
                self.history.prepare(store)
        except (BackendError, PermissionError):
            return
        except SQLAlchemyError as exc:
            log.warning("the stats history's table could not be made ready (samples are skipped until it is): %s",
                        exc)

    @property
    def token_path(self) -> Path | None:
        return self.token.path

    def apply_persisted(self) -> dict:
        """Apply the settings a PATCH /config kept in the data folder, except those the flags or
        the environment set explicitly; a setting that cannot be applied is logged and skipped.
        Returns what was applied."""
        from chunkstore.api.schemas.config import ConfigPatch  # the one validation of live settings

        saved = self.settings_file.read()
        applied = {}
        skip = set(shadowed(saved, self.explicit_settings))
        for name, value in sorted(saved.items()):
            try:
                patch = ConfigPatch.model_validate({name: value})
                patch.check_disk_size(self.backend.identity.page_size_bytes)  # a file saved before the check
                changes = patch.changes()
                if name in skip:
                    log.info("persisted setting %s=%r: the flag or environment variable given wins", name, value)
                    continue
                self.backend.reconfigure(changes)
            except (ValueError, BackendError) as exc:
                log.warning("persisted setting %s=%r not applied: %s", name, value, exc)
                continue
            applied.update(changes)
        if applied:
            log.info("applied persisted settings from %s: %s", self.settings_file.path, applied)
        return applied

    def start(self) -> None:
        self.closing.clear()
        self.sampler.start()

    def close(self) -> None:
        self.closing.set()
        self.sampler.stop()
        self.jobs.close()
        self.history.close()
