"""Shared fixtures of morio's Python tests."""

import logging
import os
import sys

import numpy as np
import pytest

# The helpers live beside this file; keep them importable under any --import-mode.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from morio import set_log_level

from _util import MEM_KINDS, Engines, make_mem, pattern, small_config


@pytest.fixture
def engines():
    """Engine factory: `engines.engine(prefix)`, `engines.pair(prefix)`; closes all at teardown."""
    f = Engines()
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(params=MEM_KINDS)
def mem(request):
    """Memory kind: numpy arrays (always), torch CPU tensors, torch CUDA tensors (skip if absent)."""
    return make_mem(request.param)


@pytest.fixture
def wired(engines):
    """Two connected engines with 64-byte buffers: (a, b, src, dst, src_md, dst_md)."""
    a, b = engines.pair("err", config=small_config(op_timeout_ms=2000))
    src, dst = pattern(64, 1), np.zeros(64, np.uint8)
    return a, b, src, dst, a.register_array(src), b.register_array(dst)


@pytest.fixture
def restore_log_level():
    """Yield the "morio" logger; restore its level (Rust side too) and handlers afterwards."""
    logger = logging.getLogger("morio")
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    names = {5: "trace", 10: "debug", 20: "info", 30: "warning", 40: "error", 50: "critical", 60: "off"}
    set_log_level(names.get(level, "warning"))
    for h in list(logger.handlers):
        if h not in handlers:
            logger.removeHandler(h)
