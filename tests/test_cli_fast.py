"""A fast, consistent command line: what the commands import, `--version`, one meaning of `--json`,
one size parser, one default per option in `--help`, the documented ports, and quiet output.

Real subprocesses, real stores in tmp_path; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chunkstore import ChunkStore, __version__, chain_pages
from chunkstore.cli import build_parser, main
from chunkstore.sizes import PoolSize, parse_bytes
from tests.helpers import TINY, kv_pages

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "fastapi")


def _python(code: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout_s)


@pytest.fixture
def store_root(tmp_path) -> Path:
    """A small real store, written by this (torch-importing) test process."""
    root = tmp_path / "store"
    with ChunkStore(root, TINY) as store:
        assert store.put(chain_pages(TINY, list(range(TINY.page_size * 6))), kv_pages(TINY, 6)).ok
    return root


# -- imports -------------------------------------------------------------------------------------

_RUN_COMMANDS = textwrap.dedent("""
    import contextlib, io, json, sys
    from chunkstore.cli import main
    root = sys.argv[1]
    codes = {}
    for argv in (["--help"], ["--version"], ["stats", "--disk-path", root], ["verify", "--disk-path", root],
                 ["gc", "--disk-path", root, "--disk-size", "1GB"], ["evict", "--disk-path", root, "--bytes", "1KB"],
                 ["db", "upgrade", "--disk-path", root], ["stats", "--help"], ["evict", "--help"],
                 ["serve", "--help"], ["admin", "--help"]):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                codes[" ".join(argv[:2])] = main(argv)
            except SystemExit as exc:
                codes[" ".join(argv[:2])] = exc.code
    print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
""")


def test_help_and_the_store_commands_import_no_torch_transformers_or_fastapi(store_root):
    out = _python(_RUN_COMMANDS, str(store_root))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert set(doc["codes"].values()) == {0}, doc["codes"]
    loaded = {name.split(".")[0] for name in doc["modules"]}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    assert "alembic" not in loaded  # an index at the current revision needs no migration machinery


def test_the_head_revision_read_from_the_scripts_is_alembics():
    from alembic.script import ScriptDirectory

    from chunkstore.disk import migrations

    assert migrations.head_revision() == ScriptDirectory.from_config(migrations._config()).get_current_head()


def test_the_package_imports_nothing_heavy_and_its_names_still_load():
    out = _python("import sys, chunkstore; before = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'); "
                  "from chunkstore import ChunkStore, ModelIdentity, chain_pages; "
                  "from chunkstore.disk.page_io import TORCH_DTYPES; "
                  "print(before, ChunkStore.__name__, sorted(TORCH_DTYPES)[0])")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "ChunkStore", "bfloat16"]


def test_a_store_opened_offline_does_not_load_torch_until_a_tensor_moves(store_root):
    out = _python(textwrap.dedent("""
        import sys
        from chunkstore.disk.keys import chain_pages
        from chunkstore.disk.store import ChunkStore, read_identity
        root = sys.argv[1]
        identity = read_identity(root)
        with ChunkStore(root, identity, read_only=True) as store:
            n = store.stats().num_chunks
            print(n, "torch" in sys.modules)
            pages = chain_pages(identity, list(range(identity.page_size * 6)))
            print(sum(t is not None for t in store.get(pages)), "torch" in sys.modules)
    """), str(store_root))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6", "False", "6", "True"]


@pytest.mark.parametrize("module", ["chunkstore.cli", "chunkstore"])  # python -m chunkstore: the same CLI
def test_version(module):
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"chunkstore {__version__}"


# -- --json: one meaning ---------------------------------------------------------------------------

def _leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaf_commands(sub, prefix + (name,))
            return
    yield prefix, parser


def test_json_is_a_flag_that_prints_json_on_every_command():
    with_json = []
    for path, parser in _leaf_commands(build_parser()):
        for action in parser._actions:
            if "--json" in action.option_strings:
                assert action.nargs == 0 and action.const is True, f"--json of {' '.join(path)} takes a value"
                with_json.append(" ".join(path))
            if isinstance(action.default, Path) or action.type is Path:
                assert "--json" not in action.option_strings
    assert {"stats", "verify", "gc", "evict", "bench store", "bench tiers", "bench multiturn", "bench startup",
            "soak crash"} <= set(with_json)


@pytest.mark.slow
def test_bench_json_prints_json_and_output_writes_a_file(tmp_path):
    """Also: without --no-progress, a bench whose stderr is not a terminal draws no progress bar."""
    out_file = tmp_path / "tiers.json"
    argv = ["bench", "tiers", "--conversations", "4", "--request-tokens", "256", "--match-page-size", "16",
            "--requests", "3", "--size-mb", "1", "--batch-pages", "4", "--layers", "2", "--kv-heads", "2",
            "--head-dim", "16", "--page-size", "16"]
    out = subprocess.run([sys.executable, "-m", "chunkstore.cli", *argv, "--json", "-o", str(out_file)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)  # stdout is exactly the JSON document
    assert printed == json.loads(out_file.read_text())
    assert "match_insert_ms" in printed
    assert "\r" not in out.stderr and "it/s" not in out.stderr, out.stderr


# -- one size parser -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("500MB", 500 * 10**6), ("2GB", 2 * 10**9), ("2G", 2 * 10**9), ("64KiB", 64 * 2**10), ("1.5GiB", 3 * 2**29),
    ("8mib", 8 * 2**20), ("1048576", 1048576), (" 10 kb ", 10_000), (4096, 4096),
])
def test_one_parser_reads_every_size_form(text, expected):
    assert parse_bytes(text) == expected
    assert PoolSize.parse(text).num_bytes == expected


@pytest.mark.parametrize("text", ["", "lots", "-5MB", "0", "0GB", "5 parsecs", "1000pages"])
def test_byte_sizes_refuse_junk_and_pages(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


def test_pages_only_where_pages_make_sense(capsys):
    assert PoolSize.parse("1000pages") == PoolSize(num_pages=1000)
    from chunkstore.cache.config import CacheConfig
    from chunkstore.server.settings import ServerSettings

    # The same text means the same bytes in a pool size, a server setting and a store command.
    assert CacheConfig(device_size="1048576").device_size_spec.num_bytes == 1048576
    assert ServerSettings(max_body_bytes="1MiB").max_body_bytes == 2**20
    with pytest.raises(ValueError, match="not a size"):
        ServerSettings(max_body_bytes="10pages")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["evict", "--bytes", "10pages"])
    assert "not a size" in capsys.readouterr().err


def test_disk_size_is_gb_or_a_size_with_a_unit_on_every_flag():
    from chunkstore.cache.config import CacheConfig

    assert CacheConfig(disk_size="500GB").disk_size == 500
    assert CacheConfig(disk_size="250MB").disk_size == 0.25
    assert CacheConfig(disk_size="2").disk_size == 2
    gc = build_parser().parse_args(["gc", "--disk-size", "500MB"])
    assert gc.disk_size_bytes == 500 * 10**6  # parsed once, at the edge, into the store's unit
    assert build_parser().parse_args(["gc", "--disk-size", "3"]).disk_size_bytes == 3 * 10**9


def test_gc_evicts_down_to_a_disk_size_given_with_a_unit(store_root, capsys):
    with ChunkStore(store_root, TINY) as store:
        stored = store.stats().stored_bytes
    assert main(["gc", "--disk-path", str(store_root), "--disk-size", f"{stored // 2}B", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["evicted_chunks"] > 0
    with ChunkStore(store_root, TINY) as store:
        assert store.stats().stored_bytes <= stored // 2


# -- help: one default per option --------------------------------------------------------------

def _option_helps(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.option_strings and action.help:
            yield action.option_strings[-1], action.help


@pytest.mark.parametrize("command", ["serve", "bench multiturn", "bench store", "bench tiers", "bench startup", "admin"])
def test_help_states_at_most_one_default_per_option(command):
    parser = dict(_leaf_commands(build_parser()))[tuple(command.split())]
    for option, help_text in _option_helps(parser):
        assert len(re.findall(r"\bdefault\b", help_text)) <= 1, f"{command} {option}: {help_text}"


# -- documented ports ----------------------------------------------------------------------------

def test_docs_name_the_ports_the_commands_use():
    from chunkstore.api.settings import AdminSettings
    from chunkstore.server.settings import ServerSettings

    serve_port, admin_port = ServerSettings.model_fields["port"].default, AdminSettings.model_fields["port"].default
    assert (serve_port, admin_port) == (8000, 8001)
    for doc in ("README.md", "docs/CLI.md", "docs/SERVER.md", "docs/API.md", "docs/WEBUI.md"):
        text = (REPO / doc).read_text()
        for port in re.findall(r"(?:127\.0\.0\.1|localhost):(\d+)", text):
            assert int(port) in (serve_port, admin_port), f"{doc} names port {port}"
    cli = (REPO / "docs/CLI.md").read_text()
    assert f"127.0.0.1:{serve_port}" in cli and f"127.0.0.1:{admin_port}" in cli


# -- quiet output --------------------------------------------------------------------------------

def test_a_store_command_shows_no_progress_bar_when_stderr_is_not_a_terminal(store_root):
    out = subprocess.run([sys.executable, "-m", "chunkstore.cli", "verify", "--disk-path", str(store_root)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    assert "checked" in out.stdout


def test_an_up_to_date_index_opens_without_alembic_lines(store_root):
    out = _python("import logging, sys; logging.basicConfig(level='INFO'); "
                  "from chunkstore.disk.store import ChunkStore, read_identity; "
                  "ChunkStore(sys.argv[1], read_identity(sys.argv[1])).close()", str(store_root))
    assert out.returncode == 0, out.stderr
    assert "alembic" not in out.stderr
