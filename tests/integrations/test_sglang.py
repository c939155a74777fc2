"""chunkstore as SGLang's HiCache L3 backend, driven by SGLang's own HiCacheController on CPU
(chunkstore/testing/sglang_harness.py): write-through, prefetch, restart, isolation of models,
ranks, namespaces and salts, corruption, both interfaces, every MHA host layout.

Run in the SGLang environment (scripts/sglang_env.sh builds it):
    .venv-sglang/bin/python -m pytest -q -p no:cacheprovider tests/integrations
Skipped entirely where SGLang is not installed (the main suite).
"""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys
import threading

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.utils import storage_namespace_seed  # noqa: E402

from chunkstore import ChunkStore  # noqa: E402
from chunkstore.disk.store_folder import read_identity  # noqa: E402
from chunkstore.integrations.sglang import BackendSettings, ChunkstoreHiCache  # noqa: E402
from chunkstore.integrations.settings import STORE_KEYS  # noqa: E402
from chunkstore.testing import sglang_harness as H  # noqa: E402

pytestmark = pytest.mark.sglang

NUM_PAGES = 5
PAGE_SIZE = 16


def extra_config(data, **more) -> dict:
    return {"backend_name": "chunkstore", "module_path": "chunkstore.integrations.sglang",
            "class_name": "ChunkstoreHiCache", "interface_v1": 1, "disk_path": str(data), **more}


@pytest.fixture(params=H.CONTROLLER_KINDS)
def kind(request):
    return request.param


@pytest.fixture
def data(tmp_path):
    return tmp_path / "kv"


@pytest.fixture
def make(tmp_path, data, kind):
    """make(layout, **kw) -> a harness over the chunkstore backend; all closed (threads joined) at the end."""
    made = []

    def _make(layout="layer_first", *, config=None, **kw):
        h = H.make_controller(tmp_path, layout=layout, backend_extra_config=config or extra_config(data),
                              page_size=PAGE_SIZE, controller_kind=kind, **kw)
        made.append(h)
        return h

    before = set(threading.enumerate())
    yield _make
    for h in made:
        h.close()
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not leftover, f"threads left running: {leftover}"


def written(h, num_pages=NUM_PAGES, seed=0, last_hash=None):
    """Write ``num_pages`` known pages through to chunkstore and wait until they are published."""
    tokens = H.make_tokens(num_pages, PAGE_SIZE, seed=seed)
    idx, pages = H.fill_host_pages(h, num_pages, seed=seed + 100)
    assert H.write_through(h, tokens, idx, last_hash=last_hash) == num_pages * PAGE_SIZE
    assert h.storage_backend.flush(timeout_s=30)
    return tokens, pages


def assert_pages(h, host_indices, expected):
    got = H.read_host_pages(h, host_indices)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert H.pages_equal(a, b), f"page {i} differs"


@pytest.mark.parametrize("interface_v1", [1, 0])
def test_a_prefetch_right_after_the_backup_ack_hits_every_page(make, data, interface_v1):
    """Once SGLang's controller acks a backup, its tree lets go of the node's host pages and a next
    request may prefetch them from storage at once. Here the store's writer cannot publish yet (its
    lock is held), and the prefetch issued right after the ack still gets every page, byte-equal."""
    h = make(config=extra_config(data, interface_v1=interface_v1))
    store = h.storage_backend.store
    tokens = H.make_tokens(NUM_PAGES, PAGE_SIZE, seed=7)
    idx, pages = H.fill_host_pages(h, NUM_PAGES, seed=107)
    with store.exclusive():  # no put publishes meanwhile
        assert H.write_through(h, tokens, idx) == NUM_PAGES * PAGE_SIZE  # acked
        assert store.num_chunks() == 0
        fetched, fresh = H.prefetch(h, tokens)
        assert fetched == NUM_PAGES * PAGE_SIZE
        assert_pages(h, fresh, pages)
    assert h.storage_backend.flush(timeout_s=30)
    assert store.num_chunks() == NUM_PAGES
    fetched, fresh = H.prefetch(h, tokens)  # now from the store
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, fresh, pages)


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_write_through_then_prefetch_is_byte_equal(make, layout):
    h = make(layout)
    assert isinstance(h.storage_backend, ChunkstoreHiCache)
    tokens, pages = written(h)
    assert h.storage_backend.store.num_chunks() == NUM_PAGES
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)
    longer = tokens + H.make_tokens(2, PAGE_SIZE, seed=50)  # only the stored prefix hits
    fetched, idx = H.prefetch(h, longer)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)
    assert H.prefetch(h, H.make_tokens(2, PAGE_SIZE, seed=51))[0] == 0


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_the_copying_interface_round_trips_too(make, data, layout):
    h = make(layout, config=extra_config(data, interface_v1=0))
    tokens, pages = written(h)
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)


def test_a_restart_serves_what_the_first_controller_wrote_in_any_layout(make):
    h1 = make("layer_first")
    tokens, pages = written(h1)
    h1.close()  # detach: the backend's close writes what is queued and closes the store
    for layout in ("page_first", "page_first_direct"):  # pages are stored layout-free
        h = make(layout)
        fetched, idx = H.prefetch(h, tokens)
        assert fetched == NUM_PAGES * PAGE_SIZE, layout
        assert_pages(h, idx, pages)
        h.close()


def test_two_engines_on_one_shared_tier_serve_each_others_pages(postgres_url, moto_s3, bucket_url, make, tmp_path,
                                                                  monkeypatch):
    for name, value in moto_s3.aws_env().items():  # the bucket's endpoint and keys, as a deployment sets them
        monkeypatch.setenv(name, value)
    shared = {"index_url": postgres_url, "object_store": bucket_url}
    h1 = make(config=extra_config(tmp_path / "engine-a", **shared))
    tokens, pages = written(h1)
    h1.close()  # (one harness at a time in a process: each holds torch.distributed's group)
    h2 = make("page_first", config=extra_config(tmp_path / "engine-b", **shared, local_cache_size="1GB"))
    assert h2.storage_backend.store.shared and h2.storage_backend.store.num_chunks() == NUM_PAGES
    for _ in range(2):  # from the bucket, then from engine b's local copy
        fetched, idx = H.prefetch(h2, tokens)
        assert fetched == NUM_PAGES * PAGE_SIZE
        assert_pages(h2, idx, pages)
    copies = h2.storage_backend.store.payloads.local_copy_stats()
    assert copies.fills == NUM_PAGES and copies.hits >= NUM_PAGES
    assert not (tmp_path / "engine-a" / "chunks").exists()  # the pages are in the bucket, not engine a's folder


def test_a_chained_write_is_found_by_one_prefetch(make):
    h = make()
    first, pages1 = written(h, 2, seed=1)
    second, pages2 = written(h, 3, seed=2, last_hash=H.page_hashes(h, first)[-1])
    fetched, idx = H.prefetch(h, first + second)
    assert fetched == 5 * PAGE_SIZE
    assert_pages(h, idx, pages1 + pages2)


@pytest.mark.parametrize("change", [
    {"model_name": "another-model"},
    {"tp_rank": 1, "tp_size": 2},
    {"config": "namespace"},
])
def test_models_ranks_and_namespaces_never_share_a_chunk(make, data, change):
    h1 = make(tp_size=2) if "tp_rank" in change else make()
    tokens, _ = written(h1)
    h1.close()
    kw = dict(change)
    if kw.pop("config", None):
        kw["config"] = extra_config(data, namespace="tenant-b")
    h2 = make(**kw)
    assert H.prefetch(h2, tokens)[0] == 0


def test_two_salts_never_share_a_chunk(make):
    h = make()
    salt_a, salt_b = (storage_namespace_seed(None, s) for s in ("salt-a", "salt-b"))
    tokens, pages = written(h, last_hash=salt_a)
    assert H.prefetch(h, tokens, last_hash=salt_b)[0] == 0
    fetched, idx = H.prefetch(h, tokens, last_hash=salt_a)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)


@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_a_corrupt_chunk_is_a_miss_for_it_and_its_suffix(make, layout):
    h = make(layout)
    tokens, pages = written(h)
    backend = h.storage_backend
    third = backend._pages([H.page_hashes(h, tokens)[2]])[0]
    path = backend.store.payloads.path_for(third.key)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == 2 * PAGE_SIZE  # the pages before it, byte-equal; nothing after it
    assert_pages(h, idx, pages[:2])
    assert H.prefetch(h, tokens)[0] == 2 * PAGE_SIZE  # quarantined: now a miss at exists already


def test_a_sealed_store_hits_after_a_restart_and_a_forged_chunk_is_a_miss_for_it_and_its_suffix(make, data,
                                                                                                  tmp_path):
    from chunkstore.disk import write_key_file

    write_key_file(tmp_path / "seal.key")
    config = extra_config(data, seal_key=str(tmp_path / "seal.key"))
    h1 = make(config=config)
    tokens, pages = written(h1)
    assert h1.storage_backend.store.is_sealed
    h1.close()
    h = make(config=config)  # a restart: warm from the sealed store
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)
    backend = h.storage_backend
    stored = backend.store.sealing.stored_pages(backend._pages(H.page_hashes(h, tokens)))
    third, fourth = (backend.store.payloads.path_for(p.key) for p in stored[2:4])
    third.write_bytes(fourth.read_bytes())  # another page's sealed body under the third's name
    h.close()
    h = make(config=config)
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == 2 * PAGE_SIZE  # the pages before it; nothing of it or after it
    assert_pages(h, idx, pages[:2])
    assert h.storage_backend.store.stats().auth_failures == 1


def test_the_store_holds_sglangs_identity_and_the_cli_reads_it_while_sglang_writes(make, data):
    h = make(model_name="Qwen/Qwen3-8B")
    written(h)
    identity = read_identity(data)
    assert identity.key_scheme == "engine" and identity.model_id.startswith("sglang:Qwen/Qwen3-8B:")
    assert (identity.num_layers, identity.num_kv_heads, identity.head_dim, identity.page_size) == (2, 2, 64, 16)
    out = subprocess.run([sys.executable, "-m", "chunkstore", "stats", "--disk-path", str(data), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["num_chunks"] == NUM_PAGES
    with ChunkStore(data, identity, read_only=True) as reader:  # beside the writer SGLang holds
        assert reader.num_chunks() == NUM_PAGES


def test_clear_and_stats(make):
    h = make()
    tokens, _ = written(h)
    metrics = h.storage_backend.get_stats()
    assert type(metrics).__name__ == "StorageMetrics"
    h.storage_backend.clear()
    assert H.prefetch(h, tokens)[0] == 0


MLA = (64, 16)  # kv_lora_rank, qk_rope_head_dim: an 80-value latent row per token and layer


@pytest.mark.parametrize("interface_v1", [1, 0])
@pytest.mark.parametrize("layout", H.LAYOUTS)
def test_mla_pages_round_trip(make, data, layout, interface_v1):
    h = make(layout, config=extra_config(data, interface_v1=interface_v1), mla_dims=MLA)
    assert h.controller.storage_config.is_mla_model
    tokens, pages = written(h)
    fetched, idx = H.prefetch(h, tokens)
    assert fetched == NUM_PAGES * PAGE_SIZE
    assert_pages(h, idx, pages)
    identity = h.storage_backend.identity
    assert ":mla:" in identity.model_id and (identity.tp_rank, identity.tp_size) == (0, 1)
    assert (identity.num_kv_heads, identity.head_dim) == (1, sum(MLA) // 2)


def test_mla_replicas_write_nothing_and_read_what_the_writer_rank_stored(make):
    reader = make(mla_dims=MLA, tp_rank=1, tp_size=2)  # before the writer rank made the store
    assert not reader.storage_backend.is_writer
    tokens = H.make_tokens(NUM_PAGES, PAGE_SIZE, seed=7)
    idx, _ = H.fill_host_pages(reader, NUM_PAGES, seed=8)
    H.write_through(reader, tokens, idx)  # SGLang skips the backup of a replica; the backend would too
    assert reader.storage_backend.batch_set_v1(H.page_hashes(reader, tokens), idx) == [True] * NUM_PAGES
    assert H.prefetch(reader, tokens)[0] == 0  # a miss, and no store was made here
    assert reader.storage_backend.store is None and not (reader.storage_backend.settings.disk_path / "store.json").exists()
    reader.close()
    writer = make(mla_dims=MLA, tp_rank=0, tp_size=2)
    assert writer.storage_backend.is_writer
    tokens, pages = written(writer)
    root, identity = writer.storage_backend.store.root, writer.storage_backend.identity
    writer.close()  # one process group per process: the writer rank's lock is held by a plain writer
    with ChunkStore(root, identity):
        reader = make(mla_dims=MLA, tp_rank=1, tp_size=2)
        fetched, idx = H.prefetch(reader, tokens)
        assert fetched == NUM_PAGES * PAGE_SIZE
        assert_pages(reader, idx, pages)
        assert reader.storage_backend.store.read_only and reader.storage_backend.store.root == root
        reader.close()


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="unknown chunkstore settings.*'disk_pth'"):
        BackendSettings.from_extra_config({"disk_pth": "/x"})
    with pytest.raises(ValueError, match="size"):
        BackendSettings.from_extra_config({"disk_size": "lots"})
    with pytest.raises(ValueError, match="zstd"):
        BackendSettings.from_extra_config({"compression": "lz4"})
    with pytest.raises(ValueError, match="postgresql"):
        BackendSettings.from_extra_config({"index_url": "mysql://db/kv"})
    with pytest.raises(ValueError, match="s3://bucket"):
        BackendSettings.from_extra_config({"object_store": "/data/kv"})
    s = BackendSettings.from_extra_config({"disk_size": "1GiB", "quota": "10MiB", "namespace": "t",
                                           "interface_v1": 1, "backend_name": "chunkstore",
                                           "local_cache_size": "2GB"})
    assert (s.disk_size_bytes, s.quota_bytes, s.namespace) == (2**30, 10 * 2**20, "t")
    assert (s.local_cache_bytes, s.index_url, s.object_store) == (2 * 10**9, None, None)


def test_every_setting_and_the_launch_line_are_documented():
    from pathlib import Path
    import importlib
    import re

    whole = (Path(__file__).resolve().parents[2] / "docs" / "INTEGRATIONS.md").read_text()
    doc = whole[whole.index("## SGLang"):whole.index("\n## ", whole.index("## SGLang") + 1)]  # its section only
    documented = set(re.findall(r"^\| `(\w+)` \|", doc, re.M))
    key_of = {field: key for key, field in STORE_KEYS.items()} | {"quota_bytes": "quota"}
    keys = {key_of.get(f, f) for f in BackendSettings.__dataclass_fields__}
    assert keys == documented
    launch = re.search(r"--hicache-storage-backend-extra-config '(.*?)'", doc, re.S).group(1)
    config = json.loads(launch)
    cls = getattr(importlib.import_module(config["module_path"]), config["class_name"])
    assert cls is ChunkstoreHiCache and config["interface_v1"] == 1
    BackendSettings.from_extra_config(config)  # the documented keys are accepted


def test_chunkstore_admin_shows_the_chunks_sglang_is_writing(make, data):
    import httpx

    from tests.api.test_admin_cli import _admin, _lines, _wait_line

    h = make()
    written(h)  # SGLang's process holds the store for writing
    proc = _admin("--disk-path", str(data), "--read-only", "--port", "0")
    try:
        err = _lines(proc.stderr)
        url = _wait_line(err, r"serving .* at (http://127\.0\.0\.1:\d+/api/v1)").group(1)
        token = Path(_wait_line(err, r"admin token in (\S+)").group(1)).read_text().strip()
        _wait_line(err, r"Application startup complete")
        assert httpx.get(url + "/stats", timeout=10).json()["disk"]["num_chunks"] == NUM_PAGES
        page = httpx.get(url + "/chunks", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        assert len(page["items"]) == NUM_PAGES
        assert {c["num_tokens"] for c in page["items"]} == {PAGE_SIZE}
    finally:
        proc.terminate()
        proc.wait(60)


BAD_NAMESPACES = [("../..", "'/'"), ("x" * (1 << 20), "1048576 characters"), ("a\0b", "control character"),
                  ("\ud800", "lone surrogate"), ("", "empty"), (".", "'.' and '..'"), (3, "text")]


def _storage_config(extra: dict):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                model_name="test-model", extra_config=extra)


@pytest.mark.parametrize("namespace, says", BAD_NAMESPACES, ids=[f"bad{i}" for i in range(len(BAD_NAMESPACES))])
def test_a_bad_namespace_is_refused_when_sglang_builds_the_backend(data, namespace, says):
    """The one rule of chunkstore/disk/namespaces.py, at construction: nothing is opened or made,
    and a 1 MB namespace is named cut short."""
    with pytest.raises(ValueError) as caught:
        ChunkstoreHiCache(_storage_config(extra_config(data, namespace=namespace)))
    message = str(caught.value)
    assert message.startswith("the extra config 'namespace': namespace ") and says in message
    assert len(message) < 600
    assert not data.exists()


def test_a_bad_namespace_stops_sglangs_controller_from_attaching_the_backend(make, data):
    with pytest.raises(ValueError) as caught:
        make(config=extra_config(data, namespace="../.."))
    assert "'namespace'" in str(caught.value) and "'/'" in str(caught.value)
    assert not data.exists()
