"""`chunkstore serve`: OpenAI- and SGLang-compatible HTTP APIs over the reference engine.

The server calls the engine's public methods only (submit, handles, flush, close); nothing below
imports it, and it never imports the management API (the chunkstore/api/ folder): the composition root,
chunkstore/serve.py, mounts that in. Importing this package imports nothing heavy:
``app.create_app(engine, settings, mount=...)`` builds the application. See docs/SERVER.md.
"""
