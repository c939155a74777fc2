"""Where a store is, as flags: ``--disk-path``, ``--index-url``, ``--object-store`` and, for a sealed
store, ``--seal-key``, declared
once for every command that opens a store (the store commands, ``chunkstore admin``) and described
in the same words for ``chunkstore serve``'s settings.

Invariant: each flag has one name, one environment variable and one default; an empty variable
means "not set". Imports no layer (a shared utility: the parser is built for every command).
"""

from __future__ import annotations

import argparse
import os

DEFAULT_DATA_DIR = "chunkstore-data"

INDEX_URL_HELP = ("the chunk index's database instead of the store's own index.db: a PostgreSQL URL "
                  "(postgresql+psycopg://USER@HOST/DATABASE) for a tier shared by many servers, or sqlite:///PATH")
OBJECT_STORE_HELP = ("the chunk payloads in an S3-compatible bucket instead of the store's folder: "
                     "s3://BUCKET[/PREFIX] (endpoint, region and keys from AWS_ENDPOINT_URL, AWS_REGION, "
                     "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)")
SEAL_KEY_HELP = ("the master key of a sealed store (a file `chunkstore keys new` made): every chunk encrypted and "
                 "authenticated, named by keyed hashes (docs/SECURITY.md); $CHUNKSTORE_SEAL_KEY may hold the "
                 "file's text instead")


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    """Add the four flags; their defaults come from CHUNKSTORE_DISK_PATH, CHUNKSTORE_INDEX_URL,
    CHUNKSTORE_OBJECT_STORE and CHUNKSTORE_SEAL_KEY_FILE, read when the parser is built."""
    parser.add_argument("--disk-path", default=_env("CHUNKSTORE_DISK_PATH") or DEFAULT_DATA_DIR,
                        help="folder of the chunk store (default ./chunkstore-data, or $CHUNKSTORE_DISK_PATH)")
    parser.add_argument("--index-url", metavar="URL", default=_env("CHUNKSTORE_INDEX_URL"),
                        help=f"{INDEX_URL_HELP} (or $CHUNKSTORE_INDEX_URL)")
    parser.add_argument("--object-store", metavar="URL", default=_env("CHUNKSTORE_OBJECT_STORE"),
                        help=f"{OBJECT_STORE_HELP} (or $CHUNKSTORE_OBJECT_STORE)")
    parser.add_argument("--seal-key", metavar="PATH", default=_env("CHUNKSTORE_SEAL_KEY_FILE"),
                        help=f"{SEAL_KEY_HELP} (or $CHUNKSTORE_SEAL_KEY_FILE)")
