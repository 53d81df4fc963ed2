"""Test-session setup shared by every test package.

On a machine without a CUDA device the Triton kernels run through Triton's interpreter on CPU tensors.
The interpreter is chosen when kernels are *defined*, so the variable must be set before anything
imports `kernels`; conftest.py is imported by pytest before any test module.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (runs through `device` on the GPU machine)")
    config.addinivalue_line("markers", "slow: longer CPU test, still run in CI")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(
        reason="needs a CUDA device; the CPU path of the same code is tested elsewhere"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def flashtrain_logs(caplog):
    """caplog that also sees flashtrain's messages.

    flashtrain's logger stops propagation to the root logger once `flashtrain.log.get_logger` has
    configured it (so rank 0 prints each line once), and caplog listens on the root logger; whether
    a test sees the messages would otherwise depend on which test configured the logger first.
    """
    import logging

    logger = logging.getLogger("flashtrain")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
