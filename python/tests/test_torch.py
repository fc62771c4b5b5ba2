"""torch specifics (skips without torch; CUDA cases skip without a GPU)."""

import gc
import weakref

import numpy as np
import pytest

from morio import MemoryLocationType

from _util import make_mem, pattern, wait_ok

torch = pytest.importorskip("torch")

DEVICES = ["cpu", "cuda"]


def _device(kind):
    return make_mem("torch" if kind == "cpu" else "cuda").device


@pytest.mark.parametrize("kind", DEVICES)
def test_non_contiguous_tensor_refused(engines, kind):
    e = engines.engine("t_noncontig", backend=False)
    x = torch.zeros((8, 8), dtype=torch.uint8, device=_device(kind))
    with pytest.raises(RuntimeError, match="contiguous"):
        e.register_torch_tensor(x.t())
    with pytest.raises((RuntimeError, ValueError), match="contiguous"):
        e.register_array(x[:, ::2])


@pytest.mark.parametrize("kind", DEVICES)
def test_tensor_views_and_dtypes(engines, kind):
    dev = _device(kind)
    e = engines.engine("t_views", backend=False)
    for dtype in (torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.int64):
        x = torch.zeros(100, dtype=dtype, device=dev)
        for md in (e.register_torch_tensor(x), e.register_array(x)):
            assert md.data == x.data_ptr() and md.size == 100 * x.element_size()
    base = torch.zeros(100, dtype=torch.float32, device=dev)
    view = base[10:30]  # storage offset
    md = e.register_torch_tensor(view)
    assert md.data == base.data_ptr() + 40 and md.size == 80
    if kind == "cuda":
        assert (md.loc, md.device_id) == (MemoryLocationType.GPU, base.device.index or 0)
    else:
        assert (md.loc, md.device_id) == (MemoryLocationType.CPU, -1)


@pytest.mark.parametrize("kind", DEVICES)
def test_registration_keeps_tensor_alive(engines, kind):
    mem = make_mem("torch" if kind == "cpu" else "cuda")
    a, b = engines.pair("t_keep")
    tgt = mem.zeros(4096)
    mem.sync()
    ref = weakref.ref(tgt)
    tmd = b.register_torch_tensor(tgt)
    del tgt
    gc.collect()
    assert ref() is not None
    src = pattern(4096, 12)
    wait_ok(a.write(a.register_array(src), 0, tmd, 0, 4096, a.allocate_transfer_uid()))
    back = np.zeros(4096, np.uint8)
    wait_ok(a.read(a.register_array(back), 0, tmd, 0, 4096, a.allocate_transfer_uid()))
    assert np.array_equal(back, src)
    b.deregister_memory(tmd)
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("kind", DEVICES)
def test_typed_tensor_roundtrip(engines, kind):
    dev = _device(kind)
    a, b = engines.pair("t_typed")
    src = torch.randn(1000, 3, dtype=torch.float32, device=dev)
    dst = torch.zeros_like(src)
    if kind == "cuda":
        torch.cuda.synchronize()
    wait_ok(a.write(a.register_torch_tensor(src), 0, b.register_torch_tensor(dst), 0, src.numel() * 4,
                    a.allocate_transfer_uid()))
    assert torch.equal(src.cpu(), dst.cpu())
