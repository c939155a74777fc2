"""Pools on a CUDA device: pinned host pool, batched host <-> device copies on a side stream
(runs and scattered slots, blocking and not), bit-identical for every 16/32-bit dtype."""

from __future__ import annotations

import pytest
import torch

from chunkstore.cache import DevicePool, HostPool, KVLayout, default_device
from chunkstore.testing.tensors import bits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DTYPES = ["bfloat16", "float16", "float32"]


def layout_of(dtype: str) -> KVLayout:
    return KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype=dtype, page_size=16)


def random_pages(layout: KVLayout, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, layout.page_size_bytes), dtype=torch.uint8, generator=g)
    return raw.view(layout.torch_dtype).reshape(n, *layout.page_shape)


def test_pools_live_where_they_should():
    layout = layout_of("bfloat16")
    host, device = HostPool(layout, 4), DevicePool(layout, 4)
    assert host.is_pinned and host.buffer.is_pinned() and host.device.type == "cpu"
    assert device.device == default_device() and device.device.type == "cuda"
    assert device.buffer.device == device.device


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_host_device_host_round_trip(dtype, scattered, non_blocking):
    layout = layout_of(dtype)
    host, device = HostPool(layout, 32), DevicePool(layout, 16)
    host.allocate(5)
    src = host.allocate(8)
    dev = device.allocate(8)
    back = host.allocate(8)
    if scattered:
        order = torch.tensor([6, 1, 7, 0, 3, 5, 2, 4])
        src, dev, back = src[order], dev[order.flip(0)], back[order]
    pages = random_pages(layout, 8, seed=DTYPES.index(dtype) * 4 + 2 * scattered + non_blocking)
    host.write(src, pages)
    stream = torch.cuda.Stream()
    event = host.copy_to(device, src, dev, non_blocking=non_blocking, stream=stream)
    if non_blocking:
        assert isinstance(event, torch.cuda.Event)
        event.synchronize()
    else:
        assert event is None
    assert torch.equal(bits(device.read(dev)), bits(pages))
    event = device.copy_to(host, dev, back, non_blocking=non_blocking, stream=stream)
    if event is not None:
        event.synchronize()
    assert torch.equal(bits(host.read(back)), bits(pages))


def test_device_to_device_copy_within_the_pool():
    layout = layout_of("float16")
    device = DevicePool(layout, 8)
    slots = device.allocate(8)
    pages = random_pages(layout, 8, seed=7)
    device.write(slots, pages.to(device.device))
    device.copy_to(device, slots[:4], slots[2:6])
    got = device.read(slots)
    assert torch.equal(bits(got[2:6]), bits(pages[:4])) and torch.equal(bits(got[6:]), bits(pages[6:]))


def test_write_refuses_host_pages_on_a_device_pool():
    layout = layout_of("bfloat16")
    device = DevicePool(layout, 2)
    with pytest.raises(ValueError, match="cuda"):
        device.write(device.allocate(1), random_pages(layout, 1, seed=0))


def test_side_stream_copy_waits_for_queued_work():
    """A copy on a side stream sees pages that the current stream is still about to write."""
    layout = layout_of("float32")
    device, host = DevicePool(layout, 64), HostPool(layout, 64)
    dev, dst = device.allocate(64), host.allocate(64)
    device.buffer.zero_()
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on the current stream, no allocation
    device.buffer.fill_(3.0)  # queued behind the spin
    event = device.copy_to(host, dev, dst, non_blocking=True, stream=stream)
    event.synchronize()
    assert bool((host.read(dst) == 3.0).all())
