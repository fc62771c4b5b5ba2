"""The target side of test_two_process.py, run in a spawned process."""

import time
import traceback

import numpy as np

N = 8192


def data(seed: int) -> np.ndarray:
    return ((np.arange(N, dtype=np.int64) * (2 * seed + 1) + seed) % 251 + 1).astype(np.uint8)


def target_main(conn, as_objects: bool) -> None:
    """Serve one initiator over `conn` (a multiprocessing Connection).

    Sends its EngineDesc and two MemoryDescs (packed bytes, or the objects themselves so that
    the pipe pickles them), waits for the initiator's desc, then for the uids of its write
    and read; checks the written bytes and pops both inbound statuses; reports back."""
    try:
        from morio import BackendType, EngineDesc, IOEngine, IOEngineConfig, TcpBackendConfig

        engine = IOEngine("two_proc_target", IOEngineConfig("127.0.0.1", 0))
        engine.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2))
        readable = data(11)  # the initiator reads this
        landing = np.zeros(N, np.uint8)  # the initiator writes here
        r_md, w_md = engine.register_array(readable), engine.register_array(landing)
        desc = engine.get_engine_desc()
        if as_objects:
            conn.send((desc, r_md, w_md))
        else:
            conn.send_bytes(desc.pack())
            conn.send_bytes(r_md.pack())
            conn.send_bytes(w_md.pack())
        peer = conn.recv() if as_objects else EngineDesc.unpack(conn.recv_bytes())
        engine.register_remote_engine(peer)
        write_uid, read_uid = conn.recv()
        inbound = {}
        deadline = time.monotonic() + 10
        while len(inbound) < 2 and time.monotonic() < deadline:
            for name, uid in (("write", write_uid), ("read", read_uid)):
                if name not in inbound:
                    st = engine.pop_inbound_transfer_status(peer.key, uid)
                    if st is not None:
                        inbound[name] = (int(st.Code()), st.Message())
            time.sleep(0.001)
        conn.send({
            "inbound": inbound,
            "landing_ok": bool(np.array_equal(landing, data(22))),
            "readable_unchanged": bool(np.array_equal(readable, data(11))),
            "again": engine.pop_inbound_transfer_status(peer.key, write_uid) is None,
            "peer_key": peer.key,
        })
        conn.recv()  # the initiator is done: tear down
        engine.close()
    except BaseException:  # report instead of leaving the parent waiting
        conn.send({"error": traceback.format_exc()})


BIG = 4 << 20


def big(seed: int) -> np.ndarray:
    return ((np.arange(BIG, dtype=np.int64) * (2 * seed + 1) + seed) % 253).astype(np.uint8)


def same_host_target_main(conn) -> None:
    """A target whose region holds big(5): sends its descriptors, waits for "done"."""
    try:
        from morio import BackendType, IOEngine, IOEngineConfig, TcpBackendConfig

        engine = IOEngine("same_host_target", IOEngineConfig("127.0.0.1", 0))
        engine.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2))
        mem = big(5)
        md = engine.register_array(mem)
        conn.send_bytes(engine.get_engine_desc().pack())
        conn.send_bytes(md.pack())
        conn.recv()
        engine.close()
    except BaseException:
        conn.send_bytes(traceback.format_exc().encode())


CUDA_BYTES = 3 << 20
VMM_BYTES = 72 << 20


def cuda_target_main(conn, mode: str, n: int = CUDA_BYTES, expandable: bool = False) -> None:
    """A target holding a CUDA tensor of `n` bytes of pattern 5 (from torch's caching
    allocator, at an offset inside its block; with `expandable`, from its expandable segments,
    starting inside a 20 MiB chunk): sends its descriptors, then on request reports a checksum
    of the tensor (after the initiator wrote it) and waits for "done"."""
    try:
        import os

        if expandable:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        import torch

        from morio import BackendType, IOEngine, IOEngineConfig, TcpBackendConfig

        engine = IOEngine("cuda_target", IOEngineConfig("127.0.0.1", 0))
        engine.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2, same_host=mode))
        pad = torch.zeros((5 << 20) if expandable else 4096, dtype=torch.uint8, device="cuda:0")
        mem = torch.from_numpy(big_n(5, n)).to("cuda:0")
        torch.cuda.synchronize()
        md = engine.register_torch_tensor(mem)
        conn.send_bytes(engine.get_engine_desc().pack())
        conn.send_bytes(md.pack())
        while True:
            msg = conn.recv()
            if msg == "done":
                break
            torch.cuda.synchronize()
            conn.send(bytes(mem.cpu().numpy().tobytes()))
        del pad
        engine.close()
    except BaseException:
        conn.send_bytes(traceback.format_exc().encode())


def big_n(seed: int, n: int) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * (2 * seed + 1) + seed) % 253 + 1).astype(np.uint8)



def vmm_main(conn, mode: str) -> None:
    """Two engines of one process whose CUDA tensors come from torch's expandable segments
    (virtual-memory chunks of 20 MiB mapped side by side): register tensors that span several
    chunks and start inside one, move them whole, in parts across the seams and as a batch,
    and report what was verified (or the traceback)."""
    try:
        import os

        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        import torch

        from morio import BackendType, IOEngine, IOEngineConfig, TcpBackendConfig

        def engine(name):
            e = IOEngine(name, IOEngineConfig("127.0.0.1", 0))
            e.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2, same_host=mode))
            return e

        a, b = engine("vmm_a"), engine("vmm_b")
        a.register_remote_engine(b.get_engine_desc())
        b.register_remote_engine(a.get_engine_desc())
        n = VMM_BYTES
        pad = torch.empty(5 << 20, dtype=torch.uint8, device="cuda:0")  # starts off a seam
        src = torch.from_numpy(big_n(3, n)).to("cuda:0")
        dst = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        segments = torch.cuda.memory._snapshot().get("segments", [])
        expandable = any(s.get("is_expandable") for s in segments)
        sm, dm = a.register_torch_tensor(src), b.register_torch_tensor(dst)
        st = a.write(sm, 0, dm, 0, n, a.allocate_transfer_uid())
        st.Wait()
        assert st.Succeeded(), st.Message()
        torch.cuda.synchronize()
        want = big_n(3, n)
        assert np.array_equal(dst.cpu().numpy(), want), "whole write"
        # Back in parts that straddle the 20 MiB seams, into a fresh tensor.
        back = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
        bm = a.register_torch_tensor(back)
        offs = [0, (20 << 20) - 4096 - 5, (40 << 20) - 7, n - (3 << 20)]
        sizes = [1 << 20, 8192 + 11, 6 << 20, 3 << 20]
        st = a.batch_read([bm], [offs], [dm], [offs], [sizes], [a.allocate_transfer_uid()])[0]
        st.Wait()
        assert st.Succeeded(), st.Message()
        got = back.cpu().numpy()
        for o, z in zip(offs, sizes):
            assert np.array_equal(got[o:o + z], want[o:o + z]), f"part at {o}"
        staged = sum(s["gpu_staged_bytes"] for s in a.stats() + b.stats())
        ipc = sum(s["gpu_ipc_bytes"] for s in a.stats() + b.stats())
        conn.send({"ok": True, "expandable": expandable, "staged": staged, "ipc": ipc})
        del pad
        a.close()
        b.close()
    except BaseException:
        conn.send({"ok": False, "error": traceback.format_exc()})


def vmm_initiator_main(conn, mode: str) -> None:
    """An initiator whose CUDA tensors come from torch's expandable segments, against a
    `cuda_target_main` of another process holding such memory too (its descriptors come
    through `conn`): reads the target's tensor whole, writes pattern 9 over it from a tensor
    of its own, then a batch of pattern 13 pieces straddling the 20 MiB seams; reports what it
    verified and its statistics (or the traceback)."""
    try:
        import os

        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        import torch

        from morio import BackendType, EngineDesc, IOEngine, IOEngineConfig, MemoryDesc
        from morio import TcpBackendConfig

        t_desc = EngineDesc.unpack(conn.recv_bytes())
        md = MemoryDesc.unpack(conn.recv_bytes())
        n = VMM_BYTES
        a = IOEngine("vmm_initiator", IOEngineConfig("127.0.0.1", 0))
        a.create_backend(BackendType.TCP, TcpBackendConfig(num_data_conns=2, same_host=mode))
        a.register_remote_engine(t_desc)
        pad = torch.empty(3 << 20, dtype=torch.uint8, device="cuda:0")
        got = torch.zeros(n, dtype=torch.uint8, device="cuda:0")
        st = a.read(a.register_torch_tensor(got), 0, md, 0, n, a.allocate_transfer_uid())
        st.Wait()
        assert st.Succeeded(), st.Message()
        torch.cuda.synchronize()
        assert np.array_equal(got.cpu().numpy(), big_n(5, n)), "read"
        src = torch.from_numpy(big_n(9, n)).to("cuda:0")
        other = torch.from_numpy(big_n(13, n)).to("cuda:0")
        torch.cuda.synchronize()
        st = a.write(a.register_torch_tensor(src), 0, md, 0, n, a.allocate_transfer_uid())
        st.Wait()
        assert st.Succeeded(), st.Message()
        om = a.register_torch_tensor(other)
        st = a.batch_write([om], [VMM_OFFS], [md], [VMM_OFFS], [VMM_SIZES], [a.allocate_transfer_uid()])[0]
        st.Wait()
        assert st.Succeeded(), st.Message()
        segments = torch.cuda.memory._snapshot().get("segments", [])
        expandable = any(s.get("is_expandable") for s in segments)
        keys = ("lane_connects", "lane_connects_same_host", "gpu_ipc_bytes", "gpu_staged_bytes")
        total = {k: sum(s[k] for s in a.stats()) for k in keys}
        conn.send({"ok": True, "expandable": expandable, **total})
        del pad
        a.close()
    except BaseException:
        conn.send({"ok": False, "error": traceback.format_exc()})


# Pieces across the 20 MiB seams of expandable segments (offsets in the tensors).
VMM_OFFS = [0, (20 << 20) - 4096 - 5, (40 << 20) - 7, VMM_BYTES - (3 << 20)]
VMM_SIZES = [1 << 20, 8192 + 11, 6 << 20, 3 << 20]
