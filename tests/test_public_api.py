"""The public surface is pinned: adding or removing a name is a decision, not an accident."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import tomllib

import xstage
import xstage.errors


def test_top_level_all_is_pinned_and_sorted():
    assert xstage.__all__ == sorted(xstage.__all__)
    assert set(xstage.__all__) == {
        "Deadlines", "DeviceReport", "Ledger", "Plan", "ReasonCode", "Refusal", "RefusalCode", "Refused",
        "RouteSpec", "RouteStatus", "Stage", "WorkerClient", "WorkerState", "XstageError",
        "__version__", "devices", "open_stage", "plan", "resolve", "resolve_all",
    } | set(xstage.errors.__all__)
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
        assert issubclass(cls, xstage.errors.XstageError), name
        assert getattr(xstage, name) is cls, f"{name} is not importable from xstage"
    assert issubclass(xstage.StageClosed, RuntimeError)  # lifecycle misuse, and an XstageError


def test_the_package_is_typed():
    assert (Path(xstage.__file__).parent / "py.typed").is_file()
    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["xstage"]


def test_open_stage_documents_every_argument():
    """Google style: an Args section naming each parameter (ruff's D417 checks the same)."""
    doc = inspect.getdoc(xstage.open_stage)
    args = doc.split("Args:", 1)[1].split("Returns:", 1)[0]
    for name in inspect.signature(xstage.open_stage).parameters:
        assert f"\n    {name}:" in "\n" + args or args.lstrip().startswith(f"{name}:"), name
