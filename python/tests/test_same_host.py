"""The same-host transport from Python: chosen between processes of this host, off on
request, required, and its configuration checked."""


import os

import numpy as np
import pytest

from morio import (
    EngineDesc,
    MemoryDesc,
    TcpBackendConfig,
    same_host_rings_unavailable,
    same_host_unavailable,
)

import _peer
from _util import finish_peer, peer_process, small_config, wait_ok


@pytest.mark.parametrize("mode", ["require", "off", "auto"])
def test_two_processes_pick_their_transport(engines, mode):
    with peer_process(_peer.same_host_target_main) as (parent, proc):
        assert parent.poll(30), "the target process did not answer"
        first = parent.recv_bytes()
        t_desc = EngineDesc.unpack(first)
        md = MemoryDesc.unpack(parent.recv_bytes())
        a = engines.engine("same_host_initiator", config=small_config(same_host=mode))
        a.register_remote_engine(t_desc)
        got = np.zeros(_peer.BIG, np.uint8)
        got_md = a.register_array(got)
        wait_ok(a.read(got_md, 0, md, 0, _peer.BIG, a.allocate_transfer_uid()))
        assert np.array_equal(got, _peer.big(5))
        src = _peer.big(9)
        src_md = a.register_array(src)
        wait_ok(a.write(src_md, 0, md, 0, _peer.BIG, a.allocate_transfer_uid()))
        back = np.zeros(_peer.BIG, np.uint8)
        wait_ok(a.read(a.register_array(back), 0, md, 0, _peer.BIG, a.allocate_transfer_uid()))
        assert np.array_equal(back, src)
        # Small writes go express (the calling thread sends them itself: into the ring
        # between processes of one host, on the socket over TCP), unless MORIO_EXPRESS=0
        # turned that off (or MORIO_EXPRESS=ring, over TCP).
        small = _peer.big(11)[:4096]
        small_md = a.register_array(small)
        for i in range(64):
            off = i * 64
            wait_ok(a.write(small_md, off, md, off, 64, a.allocate_transfer_uid()))
        back = np.zeros(4096, np.uint8)
        back_md = a.register_array(back)
        for i in range(8):
            off = i * 512
            wait_ok(a.read(back_md, off, md, off, 512, a.allocate_transfer_uid()))
        assert np.array_equal(back, small)
        shards = a.stats()
        keys = ("lane_connects", "lane_connects_same_host", "lane_connects_ring",
                "express_writes", "express_reads", "inbound_writes_dropped",
                "writes_fenced", "fences_timed_out", "finishes_held")
        total = {k: sum(s[k] for s in shards) for k in keys}
        # Nothing failed: no write was dropped by a target or fenced after an early failure.
        assert total["inbound_writes_dropped"] == total["writes_fenced"] == 0, total
        assert total["fences_timed_out"] == total["finishes_held"] == 0, total
        express = os.environ.get("MORIO_EXPRESS", "1").strip()
        express_on = express != "0" and not (express == "ring" and mode == "off")
        reads_on = express_on and os.environ.get("MORIO_EXPRESS_READS", "1").strip() != "0"
        if not express_on:
            assert total["express_writes"] == 0, total
        else:
            assert total["express_writes"] >= 1, total
        assert (total["express_reads"] >= 1) == reads_on, total
        assert total["lane_connects"] >= 1
        if mode == "off":
            assert total["lane_connects_same_host"] == total["lane_connects_ring"] == 0, total
        else:
            # Between two processes: same host, small frames through shared-memory rings.
            assert (
                total["lane_connects_same_host"]
                == total["lane_connects_ring"]
                == total["lane_connects"]
            ), total
        finish_peer(parent, proc)


def test_same_host_configuration_is_checked():
    assert TcpBackendConfig().same_host is None
    assert TcpBackendConfig(same_host="off").same_host == "off"
    c = TcpBackendConfig(same_host="Require")
    assert c.same_host == "require"
    c.same_host = None
    assert c.same_host is None
    assert TcpBackendConfig().gpu_ipc is None
    assert TcpBackendConfig(gpu_ipc=False).gpu_ipc is False
    c.gpu_ipc = True
    assert c.gpu_ipc is True
    with pytest.raises(ValueError, match="auto, off or require"):
        TcpBackendConfig(same_host="sideways")
    assert TcpBackendConfig().same_host_ring_bytes is None
    assert TcpBackendConfig(same_host_ring_bytes=256 << 10).same_host_ring_bytes == 256 << 10
    with pytest.raises(ValueError, match="power of two"):
        TcpBackendConfig(same_host_ring_bytes=100_000)
    c = TcpBackendConfig()
    with pytest.raises(ValueError, match="power of two"):
        c.same_host_ring_bytes = 32 << 20
    assert c.same_host_ring_bytes is None
    assert TcpBackendConfig(max_protocol_version=6).max_protocol_version == 6
    with pytest.raises(ValueError, match="max_protocol_version"):
        TcpBackendConfig(max_protocol_version=99)


def test_same_host_readiness_matches_what_engines_do(engines):
    """same_host_unavailable() is None exactly when two engines here take the transport."""
    why = same_host_unavailable()
    a, b = engines.pair("readiness", config=small_config(same_host="auto"))
    src = np.arange(1 << 20, dtype=np.uint8)
    dst = np.zeros(1 << 20, np.uint8)
    wait_ok(a.write(a.register_array(src), 0, b.register_array(dst), 0, 1 << 20, a.allocate_transfer_uid()))
    assert np.array_equal(src, dst)
    shards = a.stats()  # one snapshot: lanes opened in the background may connect meanwhile
    used = sum(s["lane_connects_same_host"] for s in shards)
    rings = sum(s["lane_connects_ring"] for s in shards)
    if why is None:
        assert used >= 1
        # same_host_rings_unavailable() is None exactly when those lanes ride rings.
        assert (rings == used) == (same_host_rings_unavailable() is None), rings
    else:
        assert used == 0, why


@pytest.mark.parametrize("mode", ["require", "off"])
def test_cuda_tensors_between_two_processes(engines, mode):
    """GPU to GPU between processes of this host: device parts through CUDA IPC handles
    (`require`) or staging over TCP (`off`), CUDA tensors from torch's caching allocator
    on both sides, verified both ways."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with peer_process(_peer.cuda_target_main, mode) as (parent, proc):
        assert parent.poll(60), "the target process did not answer"
        first = parent.recv_bytes()
        t_desc = EngineDesc.unpack(first)
        md = MemoryDesc.unpack(parent.recv_bytes())
        n = _peer.CUDA_BYTES
        a = engines.engine("cuda_initiator", config=small_config(same_host=mode))
        a.register_remote_engine(t_desc)
        got = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
        wait_ok(a.read(a.register_torch_tensor(got), 0, md, 0, n, a.allocate_transfer_uid()))
        torch.cuda.synchronize()
        assert np.array_equal(got.cpu().numpy(), _peer.big_n(5, n))
        src = torch.from_numpy(_peer.big_n(9, n)).to("cuda:0")
        torch.cuda.synchronize()
        src_md = a.register_torch_tensor(src)
        wait_ok(a.write(src_md, 0, md, 0, n, a.allocate_transfer_uid()))
        # A batch of scattered pieces at odd offsets, from another tensor, over the write.
        other = torch.from_numpy(_peer.big_n(13, n)).to("cuda:0")
        torch.cuda.synchronize()
        offs = [i * 65536 + 7 for i in range(16)]
        sizes = [40_000] * 16
        other_md = a.register_torch_tensor(other)
        wait_ok(a.batch_write([other_md], [offs], [md], [offs], [sizes], [a.allocate_transfer_uid()])[0])
        want = _peer.big_n(9, n)
        for o, z in zip(offs, sizes):
            want[o:o + z] = _peer.big_n(13, n)[o:o + z]
        parent.send("checksum")
        assert parent.poll(60)
        there = np.frombuffer(parent.recv(), np.uint8)
        assert np.array_equal(there, want)
        shards = a.stats()
        keys = ("lane_connects", "lane_connects_same_host", "gpu_ipc_bytes", "gpu_staged_bytes")
        total = {k: sum(s[k] for s in shards) for k in keys}
        if mode == "off":
            assert total["lane_connects_same_host"] == 0, total
            assert total["gpu_ipc_bytes"] == 0 and total["gpu_staged_bytes"] > 0, total
        else:
            assert total["lane_connects_same_host"] == total["lane_connects"] >= 1, total
            # Device to device through CUDA IPC, nothing staged.
            assert total["gpu_ipc_bytes"] > 0 and total["gpu_staged_bytes"] == 0, total
        finish_peer(parent, proc)


@pytest.mark.parametrize("mode", ["require", "off"])
def test_cuda_tensors_from_expandable_segments(mode):
    """CUDA tensors from torch's expandable segments (virtual-memory chunks mapped side by
    side; the driver reports one chunk per address) register whole and move intact, across
    the chunks' seams, in a process of their own (the allocator is chosen at CUDA's start)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    with peer_process(_peer.vmm_main, mode) as (parent, proc):
        assert parent.poll(120), "the process did not answer"
        got = parent.recv()
        assert got["ok"], got.get("error")
        print(got)
        assert got["expandable"], "torch did not use expandable segments here"
        proc.join(20)
        assert proc.exitcode == 0


@pytest.mark.parametrize("mode", ["require", "off"])
def test_cuda_vmm_tensors_between_two_processes(mode):
    """CUDA tensors from torch's expandable segments in two processes: each 20 MiB chunk is
    exported as a file descriptor, taken by the peer process (`pidfd_getfd`) and mapped, so
    reads and writes across the chunks' seams move device to device (`require`), or staged
    over TCP (`off`); verified both ways."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    n = _peer.VMM_BYTES
    with peer_process(_peer.cuda_target_main, mode, n, True) as (target, tproc):
        assert target.poll(120), "the target process did not answer"
        t_desc, md = target.recv_bytes(), target.recv_bytes()
        with peer_process(_peer.vmm_initiator_main, mode) as (init, iproc):
            init.send_bytes(t_desc)
            init.send_bytes(md)
            assert init.poll(120), "the initiator did not answer"
            got = init.recv()
            assert got["ok"], got.get("error")
            print(got)
            assert got["expandable"], "torch did not use expandable segments here"
            if mode == "off":
                assert got["gpu_ipc_bytes"] == 0 and got["gpu_staged_bytes"] > 0, got
            else:
                assert got["lane_connects_same_host"] == got["lane_connects"] >= 1, got
                # Both ways through the chunks' descriptors, nothing staged.
                assert got["gpu_ipc_bytes"] > 0 and got["gpu_staged_bytes"] == 0, got
            iproc.join(20)
            assert iproc.exitcode == 0
        want = _peer.big_n(9, n)
        for o, z in zip(_peer.VMM_OFFS, _peer.VMM_SIZES):
            want[o:o + z] = _peer.big_n(13, n)[o:o + z]
        target.send("checksum")
        assert target.poll(60)
        there = np.frombuffer(target.recv(), np.uint8)
        assert np.array_equal(there, want)
        finish_peer(target, tproc)


def test_gpu_ipc_check_says_why_not():
    """gpu_ipc_unavailable() is None only where the build has a GPU runtime and it exports
    memory; anywhere else it names the reason."""
    import morio

    why = morio.gpu_ipc_unavailable()
    if not morio.GPU_RUNTIMES:
        assert why is not None and "no GPU runtime" in why, why
    elif why is not None:
        assert isinstance(why, str) and why
