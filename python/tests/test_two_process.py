"""Two processes exchange packed (or pickled) descriptors over a pipe and transfer."""

import pickle

import numpy as np
import pytest

from morio import EngineDesc, MemoryDesc, MemoryLocationType, StatusCode

import _peer
from _util import finish_peer, peer_process, wait_ok


def _recv(conn, timeout_s=20.0):
    assert conn.poll(timeout_s), "the target process did not answer"
    return conn.recv()


def _recv_bytes(conn, timeout_s=20.0):
    assert conn.poll(timeout_s), "the target process did not answer"
    return conn.recv_bytes()


@pytest.mark.parametrize("as_objects", [False, True], ids=["packed", "pickled"])
def test_two_processes(engines, as_objects):
    with peer_process(_peer.target_main, as_objects) as (parent, proc):
        if as_objects:
            msg = _recv(parent)
            assert not isinstance(msg, dict), msg.get("error")
            t_desc, r_md, w_md = msg
        else:
            t_desc = EngineDesc.unpack(_recv_bytes(parent))
            r_md = MemoryDesc.unpack(_recv_bytes(parent))
            w_md = MemoryDesc.unpack(_recv_bytes(parent))
        assert isinstance(t_desc, EngineDesc) and isinstance(r_md, MemoryDesc)
        assert t_desc.pid == proc.pid and t_desc.port > 0 and t_desc.key == "two_proc_target"
        assert (r_md.engine_key, r_md.size, r_md.loc) == ("two_proc_target", _peer.N, MemoryLocationType.CPU)

        a = engines.engine("two_proc_initiator")
        a.register_remote_engine(t_desc)
        if as_objects:
            parent.send(a.get_engine_desc())  # pickled by the pipe
        else:
            parent.send_bytes(a.get_engine_desc().pack())

        src = _peer.data(22)
        got = np.zeros(_peer.N, np.uint8)
        src_md, got_md = a.register_array(src), a.register_array(got)
        write_uid, read_uid = a.allocate_transfer_uid(), a.allocate_transfer_uid()
        wait_ok(a.write(src_md, 0, w_md, 0, _peer.N, write_uid))
        wait_ok(a.read(got_md, 0, r_md, 0, _peer.N, read_uid))
        assert np.array_equal(got, _peer.data(11))
        parent.send((write_uid, read_uid))

        report = _recv(parent)
        assert "error" not in report, report.get("error")
        assert report["landing_ok"] and report["readable_unchanged"]
        assert report["inbound"] == {"write": (int(StatusCode.SUCCESS), ""), "read": (int(StatusCode.SUCCESS), "")}
        assert report["again"]  # popping is destructive
        assert report["peer_key"] == a.get_engine_desc().key
        finish_peer(parent, proc)


def test_descriptor_pickle_roundtrip(engines):
    e = engines.engine("pickle")
    arr = np.zeros(100, np.float64)
    md = e.register_array(arr)
    desc = e.get_engine_desc()
    for obj in (desc, md):
        for proto in range(2, pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(obj, protocol=proto))
            assert back == obj and hash(back) == hash(obj) and type(back) is type(obj)
    back = pickle.loads(pickle.dumps(md))
    assert (back.engine_key, back.id, back.data, back.size, back.loc, back.device_id) == (
        desc.key, md.id, arr.ctypes.data, 800, MemoryLocationType.CPU, -1)
    assert pickle.loads(pickle.dumps(desc)).port == desc.port
