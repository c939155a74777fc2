"""`chunkstore serve`: OpenAI- and SGLang-compatible HTTP APIs over the reference engine.

The server calls the engine's public methods only (submit, handles, flush, close); nothing below
imports it. Importing this package imports nothing heavy: ``app.create_app(engine, settings)``
builds the application, ``main.run(args)`` the whole process. See docs/SERVER.md.
"""
