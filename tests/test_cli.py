"""The `chunkstore` command line, run in-process and as the installed console script, and a check
that every command and option is documented in docs/CLI.md."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chunkstore import ChunkStore
from chunkstore.cli import build_parser, main, parse_size_bytes
from tests.helpers import TINY
from tests.helpers.api import fill_store

DOCS = Path(__file__).resolve().parent.parent / "docs" / "CLI.md"


@pytest.fixture
def filled(tmp_path):
    root = tmp_path / "store"
    pages, other = fill_store(root)
    return root, pages, other


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_stats_json(filled, capsys):
    root, _, _ = filled
    code, doc = run_json(capsys, "stats", "--disk-path", str(root))
    assert code == 0
    assert doc["num_chunks"] == 10 and doc["hits"] == 2
    assert {n["namespace"] for n in doc["namespaces"]} == {"default", "other"}
    assert doc["compression_ratio"] == pytest.approx(doc["raw_bytes"] / doc["stored_bytes"])


def test_stats_text(filled, capsys):
    root, _, _ = filled
    assert main(["stats", "--disk-path", str(root)]) == 0
    out = capsys.readouterr().out
    assert "chunks             10" in out and "namespace 'other'" in out


def test_verify_clean_and_with_a_corrupt_chunk(filled, capsys):
    root, pages, _ = filled
    code, doc = run_json(capsys, "verify", "--disk-path", str(root))
    assert code == 0
    assert {k: doc[k] for k in ("checked", "ok", "corrupt", "missing", "quarantined")} == \
        {"checked": 10, "ok": 10, "corrupt": 0, "missing": 0, "quarantined": 0}
    path = root / "chunks" / pages[3].key.hex()[:2] / pages[3].key.hex()[2:4] / (pages[3].key.hex() + ".kv")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    (root / "chunks" / pages[5].key.hex()[:2] / pages[5].key.hex()[2:4] / (pages[5].key.hex() + ".kv")).unlink()
    code, doc = run_json(capsys, "verify", "--disk-path", str(root))
    assert code == 1 and doc["corrupt"] == 1 and doc["missing"] == 1 and doc["quarantined"] == 0
    assert path.exists()  # verify without --repair changes nothing
    code, doc = run_json(capsys, "verify", "--repair", "--disk-path", str(root))
    assert code == 0 and doc["quarantined"] == 1 and doc["rows_dropped"] == 1
    assert not path.exists() and len(list((root / "quarantine").iterdir())) == 1
    code, doc = run_json(capsys, "verify", "--disk-path", str(root))
    assert code == 0 and doc["checked"] == 8 and doc["ok"] == 8


def test_evict_by_bytes_and_namespace(filled, capsys):
    root, pages, other = filled
    code, doc = run_json(capsys, "evict", "--bytes", "1", "--disk-path", str(root))
    assert code == 0 and doc["evicted_chunks"] == 1
    code, doc = run_json(capsys, "evict", "--namespace", "other", "--disk-path", str(root))
    assert code == 0 and doc["evicted_chunks"] == 2
    with ChunkStore(root, TINY, read_only=True) as s:
        assert s.exists([p.key for p in other]) == [False, False]
        assert s.stats().num_chunks == 7


def test_evict_needs_an_argument(filled, capsys):
    root, _, _ = filled
    with pytest.raises(SystemExit) as exc:
        main(["evict", "--disk-path", str(root)])
    assert exc.value.code == 2
    assert "--bytes" in capsys.readouterr().err


def test_gc_evicts_to_disk_size_and_removes_temps(filled, capsys):
    root, _, _ = filled
    (root / "tmp" / "tmp-deadbeef-1-2").write_bytes(b"partial")
    code, doc = run_json(capsys, "gc", "--disk-size", "0.000004", "--disk-path", str(root))
    assert code == 0
    with ChunkStore(root, TINY, read_only=True) as s:
        assert s.stats().stored_bytes <= 4000
    assert doc["evicted_chunks"] > 0
    assert not any((root / "tmp").iterdir())


def test_rebuild_and_db_upgrade(filled, capsys):
    root, pages, _ = filled
    for f in root.glob("index.db*"):
        f.unlink()
    code, doc = run_json(capsys, "rebuild", "--disk-path", str(root))
    assert code == 0 and doc["indexed"] == 10 and doc["quarantined"] == 0
    code, doc = run_json(capsys, "db", "upgrade", "--disk-path", str(root))
    assert code == 0 and doc["from_revision"] == doc["to_revision"]
    with ChunkStore(root, TINY, read_only=True) as s:
        assert s.longest_prefix([p.key for p in pages]) == 8


def test_errors_are_clear(tmp_path, filled, capsys):
    assert main(["stats", "--disk-path", str(tmp_path / "none")]) == 2
    assert "no chunk store" in capsys.readouterr().err
    root, _, _ = filled
    with ChunkStore(root, TINY):  # holds the writer lock
        assert main(["gc", "--disk-path", str(root)]) == 2
        assert "another process" in capsys.readouterr().err
        assert main(["stats", "--disk-path", str(root)]) == 0  # read-only beside a writer
    with pytest.raises(SystemExit):
        main(["evict", "--bytes", "lots", "--disk-path", str(root)])
    assert "not a size" in capsys.readouterr().err


def test_a_store_flag_that_cannot_be_used_is_named_with_its_value(tmp_path, filled, capsys):
    root, _, _ = filled
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for argv, says in [(["--disk-path", str(a_file)], "--disk-path (or $CHUNKSTORE_DISK_PATH) '"),
                       (["--disk-path", "/tmp/" + "x" * 5000], "at most 4095 bytes"),
                       (["--disk-path", str(root), "--index-url", "mysql://db/kv"], "--index-url (or "),
                       (["--disk-path", str(root), "--object-store", "/data/kv"], "--object-store (or ")]:
        assert main(["stats", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("chunkstore: error: ") and says in err and "Traceback" not in err
        assert len(err) < 600  # a long value is cut short


@pytest.mark.parametrize("namespace", ["../..", "x" * 300, "a\nb", "."])
def test_a_namespace_that_cannot_be_one_is_refused_before_the_store_opens(filled, capsys, namespace):
    root, _, _ = filled
    assert main(["evict", "--namespace", namespace, "--disk-path", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("chunkstore: error: --namespace: namespace ") and "1-256 characters" in err
    with ChunkStore(root, TINY, read_only=True) as s:
        assert s.num_chunks() == 10


@pytest.mark.parametrize("text,expected", [("1048576", 1048576), ("500MB", 500 * 10**6), ("2GiB", 2 * 2**30),
                                           ("1.5G", 1_500_000_000), ("64kib", 65536)])
def test_parse_size(text, expected):
    assert parse_size_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "-5", "0", "12XB", "abc"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size_bytes(text)


def test_console_script_runs(filled):
    root, _, _ = filled
    out = subprocess.run([sys.executable, "-m", "chunkstore.cli", "stats", "--json", "--disk-path", str(root)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["num_chunks"] == 10


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))
            return
    yield prefix, parser


COMMON_STORE_OPTIONS = ("--json", "--disk-path", "--index-url", "--object-store", "--seal-key")


def test_every_command_and_option_is_documented():
    docs = DOCS.read_text()
    commands = list(_commands(build_parser()))
    assert len(commands) >= 8
    for path, parser in commands:
        heading = re.search(rf"^## `chunkstore {' '.join(path)}\b.*$", docs, re.MULTILINE)
        assert heading, f"`chunkstore {' '.join(path)}` has no section in docs/CLI.md"
        start = heading.start()
        nxt = docs.find("\n## ", heading.end())
        section = docs[start: nxt if nxt != -1 else len(docs)]
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in ("--help",) + COMMON_STORE_OPTIONS:
                    assert opt in section, f"{opt} of `chunkstore {' '.join(path)}` is not in docs/CLI.md"
    for common in COMMON_STORE_OPTIONS:  # documented once, at the top
        assert common in docs.split("\n## ")[0]
