"""CacheConfig: defaults, CHUNKSTORE_* environment variables, flags over env, error messages that list
the valid values, size parsing, derived pool sizes, and docs/CONFIG.md covering every setting."""

from __future__ import annotations

import argparse
import enum
import re
from pathlib import Path

import pytest

from chunkstore import Codec
from chunkstore.cache import CacheConfig, Compression, KVLayout, PoolSize, PrefetchPolicy, WritePolicy
from chunkstore.cache.config import add_cli_arguments, env_name, flag_name
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.priority import ThreadPriority

DOCS = Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md"
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, dtype="bfloat16", page_size=64)  # 16 KiB pages
PAGE = LAYOUT.page_size_bytes
POLICY_FIELDS = {
    "write_policy": WritePolicy, "prefetch_policy": PrefetchPolicy,
    "compression": Compression, "eviction_policy": EvictionPolicy, "background_priority": ThreadPriority,
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in CacheConfig.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults():
    c = CacheConfig()
    assert c.page_size == 64 and c.device_size == "1GB" and c.host_ratio == 2.0 and c.host_size is None
    assert c.use_disk is True and c.disk_path == Path("chunkstore-data")
    assert c.disk_ratio is None and c.disk_size is None
    assert c.write_policy is WritePolicy.WRITE_THROUGH and c.write_through_threshold == 2
    assert c.prefetch_policy is PrefetchPolicy.BEST_EFFORT and c.prefetch_timeout_s == 1.0
    assert c.compression is Compression.AUTO and c.eviction_policy is EvictionPolicy.LRU


def test_frozen():
    with pytest.raises(ValueError):
        CacheConfig().page_size = 32


def test_env_vars(monkeypatch):
    monkeypatch.setenv("CHUNKSTORE_PAGE_SIZE", "16")
    monkeypatch.setenv("CHUNKSTORE_DEVICE_SIZE", "100pages")
    monkeypatch.setenv("CHUNKSTORE_HOST_SIZE", "4GiB")
    monkeypatch.setenv("CHUNKSTORE_USE_DISK", "false")
    monkeypatch.setenv("CHUNKSTORE_DISK_PATH", "/tmp/kv")
    monkeypatch.setenv("CHUNKSTORE_DISK_SIZE", "12.5")
    monkeypatch.setenv("chunkstore_write_policy", "write-back")  # names are case-insensitive
    monkeypatch.setenv("CHUNKSTORE_EVICTION_POLICY", "LFU")
    monkeypatch.setenv("CHUNKSTORE_PREFETCH_TIMEOUT_S", "0.25")
    c = CacheConfig()
    assert (c.page_size, c.device_size, c.host_size, c.use_disk) == (16, "100pages", "4GiB", False)
    assert c.disk_path == Path("/tmp/kv") and c.disk_size == 12.5 and c.prefetch_timeout_s == 0.25
    assert c.write_policy is WritePolicy.WRITE_BACK and c.eviction_policy is EvictionPolicy.LFU


def test_empty_env_var_means_unset(monkeypatch):
    monkeypatch.setenv("CHUNKSTORE_HOST_SIZE", "")
    monkeypatch.setenv("CHUNKSTORE_DISK_SIZE", " ")
    c = CacheConfig()
    assert c.host_size is None and c.disk_size is None


def test_flags_override_env_which_overrides_defaults(monkeypatch):
    monkeypatch.setenv("CHUNKSTORE_PAGE_SIZE", "16")
    monkeypatch.setenv("CHUNKSTORE_WRITE_POLICY", "write_back")
    monkeypatch.setenv("CHUNKSTORE_USE_DISK", "false")
    c = CacheConfig.from_cli_args(parse_flags("--page-size", "32", "--use-disk"))
    assert c.page_size == 32 and c.use_disk is True  # flags win
    assert c.write_policy is WritePolicy.WRITE_BACK  # env where no flag
    assert c.host_ratio == 2.0  # default where neither
    assert CacheConfig.from_cli_args(parse_flags()).page_size == 16


def test_every_flag_parses():
    args = parse_flags(
        "--page-size", "16", "--device-size", "2GB", "--host-ratio", "3", "--host-size", "8GB",
        "--no-use-disk", "--disk-path", "/data/kv", "--disk-ratio", "4", "--disk-size", "100",
        "--write-policy", "write_through_selective", "--write-through-threshold", "5",
        "--prefetch-policy", "timeout", "--prefetch-timeout-s", "0.5", "--prefetch-host-share", "0.75",
        "--prefetch-hold-s", "12", "--compression", "zstd", "--disk-load-host-share", "0.25",
        "--eviction-policy", "lfu", "--background-priority", "low",
        "--index-url", "postgresql+psycopg://kv@db.internal/chunks", "--object-store", "s3://kv-cache/llama",
        "--local-cache-size", "50GB", "--seal-key", "/etc/chunkstore/seal.key",
    )
    c = CacheConfig.from_cli_args(args)
    assert c.model_dump() == {
        "page_size": 16, "device_size": "2GB", "host_ratio": 3.0, "host_size": "8GB", "use_disk": False,
        "disk_path": Path("/data/kv"), "disk_ratio": 4.0, "disk_size": 100.0,
        "index_url": "postgresql+psycopg://kv@db.internal/chunks", "object_store": "s3://kv-cache/llama",
        "local_cache_size": 50.0, "seal_key_file": Path("/etc/chunkstore/seal.key"),
        "write_policy": WritePolicy.WRITE_THROUGH_SELECTIVE, "write_through_threshold": 5,
        "prefetch_policy": PrefetchPolicy.TIMEOUT, "prefetch_timeout_s": 0.5, "prefetch_host_share": 0.75,
        "prefetch_hold_s": 12.0, "compression": Compression.ZSTD, "disk_load_host_share": 0.25, "eviction_policy": EvictionPolicy.LFU,
        "background_priority": ThreadPriority.LOW,
    }


@pytest.mark.parametrize("field, value, why", [
    ("index_url", "mysql://db/chunks", "only sqlite"),
    ("index_url", "not a url", "not a database URL"),
    ("object_store", "http://bucket/x", "s3://bucket"),
])
def test_a_shared_tier_url_that_is_not_one_is_refused(field, value, why):
    with pytest.raises(ValueError, match=why):
        CacheConfig(**{field: value})


def test_unrelated_namespace_attributes_are_ignored():
    args = parse_flags("--page-size", "8")
    args.json = True  # a serve flag that is not a cache setting
    assert CacheConfig.from_cli_args(args).page_size == 8


@pytest.mark.parametrize("field, enum_type", POLICY_FIELDS.items())
def test_unknown_policy_lists_valid_values(field, enum_type, monkeypatch, capsys):
    valid = [member.value for member in enum_type]
    with pytest.raises(ValueError) as info:
        CacheConfig(**{field: "bogus"})
    assert "bogus" in str(info.value) and all(v in str(info.value) for v in valid)

    monkeypatch.setenv(env_name(field), "bogus")
    with pytest.raises(ValueError) as info:
        CacheConfig()
    assert all(v in str(info.value) for v in valid)
    monkeypatch.delenv(env_name(field))

    with pytest.raises(SystemExit):
        parse_flags(flag_name(field), "bogus")
    err = capsys.readouterr().err
    assert "bogus" in err and all(v in err for v in valid)


@pytest.mark.parametrize("field, enum_type", POLICY_FIELDS.items())
def test_policies_accept_any_case_and_dashes(field, enum_type):
    for member in enum_type:
        spelled = member.value.upper().replace("_", "-")
        assert getattr(CacheConfig(**{field: spelled}), field) is member
        assert getattr(CacheConfig.from_cli_args(parse_flags(flag_name(field), spelled)), field) is member


@pytest.mark.parametrize("kwargs, match", [
    ({"page_size": 0}, "page_size"),
    ({"host_ratio": 0.5}, "host_ratio"),
    ({"disk_ratio": 0}, "disk_ratio"),
    ({"disk_size": -1}, "disk_size"),
    ({"write_through_threshold": 0}, "write_through_threshold"),
    ({"prefetch_timeout_s": 0}, "prefetch_timeout_s"),
    ({"device_size": "1000 parsecs"}, "1000pages"),  # an unknown unit: the message shows the forms
    ({"host_size": "lots"}, "not a size"),
    ({"device_size": "2GB", "host_size": "1GB"}, "smaller than device_size"),
    ({"device_size": "100pages", "host_size": "99pages"}, "smaller than device_size"),
    ({"bogus_setting": 1}, "bogus_setting"),
])
def test_invalid_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CacheConfig(**kwargs)


def test_bad_size_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse_flags("--device-size", "12 lots")
    assert "1000pages" in capsys.readouterr().err


@pytest.mark.parametrize("text, num_bytes, num_pages", [
    ("2GB", 2 * 10**9, None), ("2gb", 2 * 10**9, None), ("2G", 2 * 10**9, None),
    ("1.5GiB", 3 * 2**29, None), ("512MiB", 512 * 2**20, None), ("64 KB", 64000, None),
    ("1TB", 10**12, None), ("4096B", 4096, None), (".5k", 500, None),
    ("1000pages", None, 1000), ("1 page", None, 1), (" 7 Pages ", None, 7),
])
def test_size_parsing(text, num_bytes, num_pages):
    assert PoolSize.parse(text) == PoolSize(num_bytes=num_bytes, num_pages=num_pages)


@pytest.mark.parametrize("text", ["", "12 lots", "GB", "2 XB", "1.5pages", "0pages", "0GB", "-1GB", "2GB2"])
def test_size_parsing_rejects(text):
    with pytest.raises(ValueError):
        PoolSize.parse(text)


def test_derived_page_counts():
    c = CacheConfig(device_size=f"{10 * PAGE + 100}B")
    assert c.device_pages(LAYOUT) == 10
    assert c.host_pages(LAYOUT) == 20  # ratio 2
    assert CacheConfig(device_size="10pages", host_ratio=2.55).host_pages(LAYOUT) == 25
    assert CacheConfig(device_size="10pages", host_size="1MiB").host_pages(LAYOUT) == 2**20 // PAGE
    assert c.disk_capacity_bytes(LAYOUT) is None  # unbounded
    assert CacheConfig(device_size="10pages", disk_ratio=3).disk_capacity_bytes(LAYOUT) == 60 * PAGE
    assert CacheConfig(disk_ratio=3, disk_size=1.5).disk_capacity_bytes(LAYOUT) == 1_500_000_000


def test_derived_sizes_check_the_layout():
    with pytest.raises(ValueError, match="holds no page"):
        CacheConfig(device_size=f"{PAGE - 1}B").device_pages(LAYOUT)
    with pytest.raises(ValueError, match="smaller than the device pool"):
        CacheConfig(device_size="10pages", host_size=f"{9 * PAGE}B").host_pages(LAYOUT)


def test_codec_follows_the_dtype():
    assert CacheConfig().codec_for(LAYOUT) is Codec.ZSTD_SPLIT
    fp32, fp8 = KVLayout(2, 2, 16, "float32", 64), KVLayout(2, 2, 16, "float8_e4m3fn", 64)
    assert CacheConfig().codec_for(fp32) is Codec.ZSTD_SPLIT and CacheConfig().codec_for(fp8) is Codec.ZSTD
    assert CacheConfig(compression="none").codec_for(LAYOUT) is Codec.NONE
    assert {c.value for c in Compression} - {"auto"} == {c.value for c in Codec}


def test_help_names_env_var_and_default():
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    text = " ".join(parser.format_help().split())
    for name in CacheConfig.model_fields:
        assert flag_name(name) in text and env_name(name) in text
    assert "(env CHUNKSTORE_PAGE_SIZE, default 64)" in text


def test_every_setting_is_documented():
    doc = DOCS.read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in doc.splitlines() if line.startswith("| `")}
    for name, info in CacheConfig.model_fields.items():
        assert name in rows, f"{name} has no row in the table of docs/CONFIG.md"
        row = rows[name]
        assert flag_name(name) in row and env_name(name) in row, f"{name}: flag or env var missing in docs/CONFIG.md"
        assert re.search(rf"^### `{name}`$", doc, re.MULTILINE), f"{name} has no section in docs/CONFIG.md"
        default = info.default
        if isinstance(default, enum.Enum):
            default = default.value
        if default is not None and not isinstance(default, (bool, Path)):
            assert f"`{default}`" in row, f"{name}: default {default} is not in docs/CONFIG.md"
        if isinstance(info.annotation, type) and issubclass(info.annotation, enum.Enum):
            for member in info.annotation:
                assert f"`{member.value}`" in row, f"{name}: value {member.value} is not in docs/CONFIG.md"
    documented = set(rows) - set(CacheConfig.model_fields)
    assert not documented, f"docs/CONFIG.md documents settings that do not exist: {documented}"
