"""The client's host as routes see it: platform (Linux, WSL, Windows, macOS), WSL facts, CPU vendor.

A host fact, read from this machine (``/proc``, ``sys.platform``); the routes judge against it
but never decide it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from xstage.host import hardware, wsl

__all__ = ["HostInfo", "host_cpu_vendor"]


def host_cpu_vendor() -> str:
    """``intel``, ``amd``, … of this machine's CPU (``unknown`` when nothing says)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        import platform

        text = f"vendor_id : {platform.processor()}\n"
    return hardware.cpu_vendor(hardware.parse_cpuinfo(text))


@dataclass(frozen=True)
class HostInfo:
    """The client's host as routes see it.

    Attributes:
        platform: ``linux`` (not WSL), ``wsl``, ``windows`` or ``darwin``.
        wsl: WSL facts (interop, distro) — meaningful when ``platform == "wsl"``.
        cpu_vendor: ``intel``, ``amd``, … (decides the ort-openvino variant).
    """

    platform: str
    wsl: wsl.WslInfo = field(default_factory=lambda: wsl.WslInfo(is_wsl=False))
    cpu_vendor: str = "unknown"

    @classmethod
    def current(cls) -> HostInfo:
        """This machine."""
        info = wsl.current() if sys.platform.startswith("linux") else wsl.WslInfo(is_wsl=False)
        if sys.platform == "win32":
            platform = "windows"
        elif sys.platform == "darwin":
            platform = "darwin"
        else:
            platform = "wsl" if info.is_wsl else "linux"
        return cls(platform=platform, wsl=info, cpu_vendor=host_cpu_vendor())

    @property
    def label(self) -> str:
        """How messages name this host."""
        return {"linux": "Linux (not WSL)", "wsl": "WSL", "windows": "Windows", "darwin": "macOS"}.get(
            self.platform, self.platform
        )
