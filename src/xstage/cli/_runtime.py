"""The onnxruntime distribution of this interpreter, checked before a command runs.

Every onnxruntime distribution (``onnxruntime``, ``onnxruntime-openvino``, ``onnxruntime-gpu``,
``onnxruntime-directml``, …) ships the same ``onnxruntime`` module, so xstage depends on none of
them: the user picks one through an extra (``xstage[cpu]``, ``[openvino]``, ``[gpu]``,
``[directml]``) or already has one, and xstage uses it as it is (README, "Install"). The client
needs it for the ``ort-cpu`` route's worker in this interpreter (where the numeric gate's
reference arm runs, unless ``XSTAGE_PYTHON_ORT_CPU`` names another), for the in-process reference
arm and for the graph tools; this module says, in one
line and before anything else runs, that none is installed or that the one installed is older
than the supported minimum, and which extra to install. It reads package metadata only: it never
imports onnxruntime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from xstage import errors

__all__ = ["DISTRIBUTION_EXTRAS", "MIN_ONNXRUNTIME", "check_onnxruntime", "installed_distribution"]

#: The oldest onnxruntime the client runs (the oldest the project's tests run: 1.19, Python 3.9's
#: newest, in tests/conftest.py's ``py39_ort119_python``).
MIN_ONNXRUNTIME = (1, 19)

#: Each distribution the extras install, and its extra (``pip install 'xstage[EXTRA]'``).
DISTRIBUTION_EXTRAS = {
    "onnxruntime": "cpu",
    "onnxruntime-openvino": "openvino",
    "onnxruntime-gpu": "gpu",
    "onnxruntime-directml": "directml",
}

_INSTALL = ("pip install 'xstage[cpu]' (or [openvino], [gpu], [directml]: the one that drives "
            "your device)")


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def installed_distribution() -> tuple[str, str] | None:
    """(distribution, version) of the package that provides the ``onnxruntime`` module, or None.

    None when no ``onnxruntime`` module can be found at all. A module no distribution claims (a
    source build on the path) reads as ``("onnxruntime", "")``: its version is not checked.
    """
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    owners = importlib.metadata.packages_distributions().get("onnxruntime") or []
    for name in sorted(set(owners)):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # pragma: no cover - metadata half gone
            continue
    return "onnxruntime", ""


def check_onnxruntime(found: tuple[str, str] | None = None, *, look: bool = True) -> None:
    """Raise when this interpreter has no onnxruntime, or one older than ``MIN_ONNXRUNTIME``.

    Args:
        found: the (distribution, version) to judge; by default, ``installed_distribution()``.
        look: whether to look at this interpreter when ``found`` is None (tests pass False to
            judge "none installed").

    Raises:
        RuntimeMissing: none is installed, or the installed one is too old; the message names it
            and the remedy the extra to install.
    """
    if found is None and look:
        found = installed_distribution()
    minimum = ".".join(map(str, MIN_ONNXRUNTIME))
    if found is None:
        raise errors.RuntimeMissing(
            f"no onnxruntime distribution is installed for this Python: install one: {_INSTALL}")
    name, version = found
    release = _release(version)
    if release and release < MIN_ONNXRUNTIME:
        extra = DISTRIBUTION_EXTRAS.get(name)
        fix = (f"pip install -U 'xstage[{extra}]'" if extra else f"pip install -U {name}")
        raise errors.RuntimeMissing(
            f"{name} {version} is older than the oldest onnxruntime xstage supports ({minimum}): "
            f"upgrade it: {fix}")
