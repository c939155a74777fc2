"""HTTP plumbing shared by the server (chunkstore/server/) and the management API (chunkstore/api/).

Each module owns one rule both apps apply: ``hosts`` (Host parsing and the loopback rule),
``body_limit`` (413), ``json_body`` (credentials, then a body's encoding, UTF-8, JSON syntax and
depth, checked before a route reads it), ``json_types`` (strict JSON Schema types for request
fields), ``bearer`` (the Authorization header and constant-time token digests),
``errors`` (exception handlers, parameterised by each app's error envelope), ``routes`` (handing a
path to another app), ``lifecycle`` (uvicorn until a signal), ``connection_limits`` (how long a
request may take to arrive, how many connections are open) and ``guarded_h11`` (uvicorn's protocol
enforcing them), and ``settings`` (fields both define).
Nothing here imports either app; importing the package imports nothing heavy.
"""
