"""HTTP plumbing shared by the server (chunkstore/server/) and the management API (chunkstore/api/).

Each module owns one rule both apps apply: ``hosts`` (Host parsing and the loopback rule),
``body_limit`` (413), ``bearer`` (the Authorization header and constant-time token digests),
``errors`` (exception handlers, parameterised by each app's error envelope), ``routes`` (handing a
path to another app), ``lifecycle`` (uvicorn until a signal) and ``settings`` (fields both define).
Nothing here imports either app; importing the package imports nothing heavy.
"""
