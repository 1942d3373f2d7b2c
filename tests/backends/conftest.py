"""Fixtures of the backends' tests."""

import pytest


@pytest.fixture(scope="module")
def nvrtc():
    from agspeed.backends.nvrtc import _libs

    version, why = _libs.nvrtc()
    assert version is not None, why  # the test set-up installs the nvrtc wheel
    return version
