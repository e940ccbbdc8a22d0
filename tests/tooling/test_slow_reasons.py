"""Every ``slow`` test says why the default run can skip it, and every module keeps a test the
default run takes: either lack stops the collection, naming the test or the module
(tests/conftest.py, ``pytest_collection_modifyitems``)."""

from __future__ import annotations

import pytest

from tests.conftest import modules_without_default, slow_reason, slow_without_reason


class _Item:
    def __init__(self, nodeid: str, mark: pytest.Mark | None) -> None:
        self.nodeid, self._mark = nodeid, mark

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return self._mark if name == "slow" else None


def test_a_slow_marker_without_a_reason_is_named_once_per_test() -> None:
    bare, why = pytest.mark.slow.mark, pytest.mark.slow(reason="a soak").mark
    items = [_Item("t.py::test_a[1]", bare), _Item("t.py::test_a[2]", bare),
             _Item("t.py::test_b", why), _Item("t.py::test_c", None),
             _Item("t.py::test_d", pytest.mark.slow("positional").mark)]
    assert slow_without_reason(items) == ["t.py::test_a"]


def test_the_skip_line_repeats_the_markers_reason() -> None:
    assert slow_reason(pytest.mark.slow(reason="a soak").mark).startswith("slow (a soak): skipped")


def test_a_module_whose_every_test_is_slow_is_named() -> None:
    slow = pytest.mark.slow(reason="a soak").mark
    items = [_Item("a.py::test_1", slow), _Item("a.py::test_2[x]", slow),
             _Item("b.py::test_1", slow), _Item("b.py::test_2", None), _Item("c.py::test_1", None)]
    assert modules_without_default(items) == ["a.py"]
