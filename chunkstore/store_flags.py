"""Where a store is, as flags: ``--disk-path``, ``--index-url``, ``--object-store`` and, for a sealed
store, ``--seal-key``, declared
once for every command that opens a store (the store commands, ``chunkstore admin``) and described
in the same words for ``chunkstore serve``'s settings.

Invariant: each flag has one name, one environment variable and one default; an empty variable
means "not set"; a value that cannot be used is reported naming its flag (and variable) and the
value (``flag_problem``). Imports no layer (a shared utility: the parser is built for every
command), so the commands check the values with the disk tier's checks.
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


# argparse dest -> (flag, environment variable)
STORE_FLAGS = {"disk_path": ("--disk-path", "CHUNKSTORE_DISK_PATH"),
               "index_url": ("--index-url", "CHUNKSTORE_INDEX_URL"),
               "object_store": ("--object-store", "CHUNKSTORE_OBJECT_STORE"),
               "seal_key": ("--seal-key", "CHUNKSTORE_SEAL_KEY_FILE")}


def flag_problem(dest: str, value: object, why: object) -> str:
    """The message for the store flag ``dest`` whose ``value`` cannot be used, and ``why``: the
    flag, its variable, the value (cut after 80 characters) and the reason."""
    flag, env = STORE_FLAGS[dest]
    return f"{flag} (or ${env}) {value!r:.80}: {why}"


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    """Add the four flags; their defaults come from CHUNKSTORE_DISK_PATH, CHUNKSTORE_INDEX_URL,
    CHUNKSTORE_OBJECT_STORE and CHUNKSTORE_SEAL_KEY_FILE (STORE_FLAGS), read when the parser is built."""
    env = {dest: variable for dest, (_, variable) in STORE_FLAGS.items()}
    parser.add_argument("--disk-path", default=_env(env["disk_path"]) or DEFAULT_DATA_DIR,
                        help=f"folder of the chunk store (default ./chunkstore-data, or ${env['disk_path']})")
    parser.add_argument("--index-url", metavar="URL", default=_env(env["index_url"]),
                        help=f"{INDEX_URL_HELP} (or ${env['index_url']})")
    parser.add_argument("--object-store", metavar="URL", default=_env(env["object_store"]),
                        help=f"{OBJECT_STORE_HELP} (or ${env['object_store']})")
    parser.add_argument("--seal-key", metavar="PATH", default=_env(env["seal_key"]),
                        help=f"{SEAL_KEY_HELP} (or ${env['seal_key']})")
