"""The torch-cuda worker's serving switches, parsed inside the worker (``cuda_serving.switch``).

The module imports no torch at the top, so this runs where torch is absent; the GPU half is
``tests/gpu``.
"""

from __future__ import annotations

import pytest

from xstage_remote.cuda_serving import switch


@pytest.mark.parametrize("value", [None, True, "on", "ON", "1", "true", "yes", " on "])
def test_on(value):
    assert switch(value, "cuda_graphs") is True


@pytest.mark.parametrize("value", [False, "off", "Off", "0", "false", "no"])
def test_off(value):
    assert switch(value, "pinned_region") is False


def test_anything_else_names_the_option():
    with pytest.raises(ValueError, match=r"cuda_graphs='later': expected on or off"):
        switch("later", "cuda_graphs")
