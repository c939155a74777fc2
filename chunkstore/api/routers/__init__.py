"""One APIRouter per resource, each with its prefix, tags, error responses and auth dependency."""

from chunkstore.api.routers import chunks, config, events, eviction, health, jobs, metrics, namespaces, stats

ROUTERS = (health.router, stats.router, chunks.router, namespaces.router, eviction.router, jobs.router,
           config.router, events.router, metrics.router)
