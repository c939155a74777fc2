"""The management REST API (FastAPI). Built by a later issue; see docs/ARCHITECTURE.md."""
