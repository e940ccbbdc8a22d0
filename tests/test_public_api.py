"""The public surface is pinned: adding or removing a name is a decision, not an accident."""

from __future__ import annotations

import importlib
import pkgutil

import xstage
import xstage.errors


def test_top_level_all_is_pinned_and_sorted():
    assert xstage.__all__ == sorted(xstage.__all__)
    assert set(xstage.__all__) == {
        "Deadlines", "DeviceReport", "Ledger", "Plan", "ReasonCode", "Refusal", "RefusalCode", "Refused",
        "RouteSpec", "RouteStatus", "Stage", "WorkerClient", "WorkerState", "XstageError",
        "__version__", "devices", "open_stage", "plan", "resolve", "resolve_all",
    }
    for name in xstage.__all__:
        assert hasattr(xstage, name), name


def test_devices_is_the_function():
    assert callable(xstage.devices) and xstage.devices.__module__ == "xstage.device_table"


def test_every_module_declares_all_and_exports_what_it_has():
    for info in pkgutil.walk_packages(xstage.__path__, "xstage."):
        if info.name.rsplit(".", 1)[-1].startswith("_") or info.name.startswith("xstage.cli"):
            continue
        module = importlib.import_module(info.name)
        assert hasattr(module, "__all__"), info.name
        for name in module.__all__:
            assert hasattr(module, name), f"{info.name}.{name}"


def test_every_error_is_an_xstage_error_with_a_docstring():
    for name in xstage.errors.__all__:
        cls = getattr(xstage.errors, name)
        assert cls.__doc__ and cls.__doc__.startswith("Raised"), name
        assert issubclass(cls, xstage.errors.XstageError) or name == "StageClosed"
