"""WSL → Windows: detect interop, translate paths, pick the connect-back address, end trees.

A route whose ``os_side`` is ``windows`` runs a Windows interpreter; from WSL it is started
through interop with the same launch code as a Linux worker, and only four things differ:
whether interop is there at all, the paths the worker is handed, the address it connects
back to, and how its whole process tree is ended. Each is a pure function over recorded
inputs here, with a thin reader beside it, so all of it is testable on a machine that is
not WSL (none of it has run on real WSL in this project yet: see docs/routes.md).
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from xstage.errors import XstageError

__all__ = [
    "ConnectBack",
    "WindowsPathError",
    "WslInfo",
    "automount_root",
    "connect_back",
    "current",
    "detect",
    "kill_tree_argv",
    "parse_networking_mode",
    "to_windows_path",
    "to_wsl_path",
    "vm_address",
    "windows_host_address",
    "wslenv_with",
]

#: Characters a Windows path component cannot hold (besides control characters).
_WINDOWS_FORBIDDEN = set('<>:"|?*\\')


class WindowsPathError(XstageError, ValueError):
    """Raised when a Linux path cannot be handed to a Windows process as a Windows path."""


@dataclass(frozen=True)
class WslInfo:
    """What this Linux is: plain Linux, or WSL (1 or 2) with or without interop.

    Attributes:
        is_wsl: the kernel is a WSL kernel.
        version: 1 or 2 (None when not WSL).
        interop: Windows executables can be started from here.
        distro: ``WSL_DISTRO_NAME`` (needed for ``\\\\wsl.localhost\\<distro>`` paths).
        evidence: what each conclusion was read from.
    """

    is_wsl: bool
    version: int | None = None
    interop: bool = False
    distro: str | None = None
    evidence: tuple[str, ...] = ()


def detect(
    *,
    proc_version: str | None,
    binfmt_entries: Mapping[str, str],
    environ: Mapping[str, str],
) -> WslInfo:
    """Decide WSL and interop from recorded inputs.

    Args:
        proc_version: the text of ``/proc/version`` (None when unreadable).
        binfmt_entries: file name → content for ``/proc/sys/fs/binfmt_misc/WSLInterop*``
            (newer WSL names it ``WSLInterop-late``); content starts ``enabled``/``disabled``.
        environ: the process environment (``WSL_INTEROP``, ``WSL_DISTRO_NAME``).
    """
    evidence: list[str] = []
    text = proc_version or ""
    is_wsl = "microsoft" in text.lower()
    version: int | None = None
    if is_wsl:
        # WSL2 kernels are "...-microsoft-standard-WSL2"; WSL1 fakes "...-Microsoft".
        version = 2 if ("wsl2" in text.lower() or "microsoft-standard" in text.lower()) else 1
        evidence.append(f"/proc/version names Microsoft (WSL{version})")
    interop = False
    for name, content in sorted(binfmt_entries.items()):
        if name.startswith("WSLInterop"):
            state = content.strip().splitlines()[0].strip() if content.strip() else ""
            evidence.append(f"binfmt_misc/{name}: {state or 'present'}")
            if state != "disabled":
                interop = True
    if environ.get("WSL_INTEROP"):
        evidence.append("WSL_INTEROP is set")
        interop = interop or not binfmt_entries
    if not is_wsl:
        interop = False
    distro = environ.get("WSL_DISTRO_NAME") or None
    return WslInfo(is_wsl=is_wsl, version=version, interop=interop, distro=distro, evidence=tuple(evidence))


def current(*, proc: Path = Path("/proc"), environ: Mapping[str, str] | None = None) -> WslInfo:
    """``detect`` over this machine's ``/proc`` and environment."""
    try:
        proc_version = (proc / "version").read_text(errors="replace")
    except OSError:
        proc_version = None
    entries: dict[str, str] = {}
    binfmt = proc / "sys" / "fs" / "binfmt_misc"
    try:
        for child in binfmt.iterdir():
            if child.name.startswith("WSLInterop"):
                try:
                    entries[child.name] = child.read_text(errors="replace")
                except OSError:
                    entries[child.name] = ""
    except OSError:
        pass
    return detect(
        proc_version=proc_version,
        binfmt_entries=entries,
        environ=os.environ if environ is None else environ,
    )


def automount_root(wsl_conf: str | None) -> str:
    """The drive mount root from ``/etc/wsl.conf`` (``[automount] root``), default ``/mnt/``."""
    root = "/mnt/"
    section = ""
    for raw in (wsl_conf or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().lower()
        elif section == "automount" and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            if key.lower() == "root" and value:
                root = value.strip("\"'")
    return root if root.endswith("/") else root + "/"


def _check_components(parts: Iterable[str], original: str) -> None:
    for part in parts:
        bad = sorted({c for c in part if c in _WINDOWS_FORBIDDEN or ord(c) < 32})
        if bad:
            raise WindowsPathError(
                f"cannot hand {original!r} to a Windows process: the name {part!r} holds "
                f"{''.join(bad)!r}, which Windows paths cannot contain",
                remedy="rename the file, or copy it under /mnt/<drive>/",
            )


def to_windows_path(path: str, *, distro: str | None, mount_root: str = "/mnt/") -> str:
    """The Windows path a Windows process must be given for the Linux ``path``.

    Rules:
        1. ``<mount_root><letter>/rest`` (``/mnt/c/x``) → ``C:\\x``.
        2. Any other absolute path lives in the Linux filesystem →
           ``\\\\wsl.localhost\\<distro>\\...``, which needs ``distro``.
        3. Anything else fails loudly: a Linux path is never handed to a Windows process.

    Raises:
        WindowsPathError: the path is relative.
        WindowsPathError: it is inside the Linux filesystem and ``distro`` is unknown.
        WindowsPathError: a component holds a character Windows paths cannot contain.
    """
    if not path.startswith("/"):
        raise WindowsPathError(
            f"cannot hand the relative path {path!r} to a Windows process",
            remedy="pass an absolute path",
        )
    norm = posixpath.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    root = mount_root if mount_root.endswith("/") else mount_root + "/"
    match = re.fullmatch(re.escape(root) + r"([A-Za-z])(/.*)?", norm)
    if match:
        drive, rest = match.group(1).upper(), match.group(2) or ""
        parts = [p for p in rest.split("/") if p]
        _check_components(parts, path)
        return drive + ":\\" + "\\".join(parts)
    if not distro:
        raise WindowsPathError(
            f"cannot hand {path!r} to a Windows process: it is inside the Linux filesystem "
            "and the WSL distribution name is unknown (WSL_DISTRO_NAME is not set)",
            remedy="put the file under /mnt/<drive>/ or run xstage from a WSL shell",
        )
    parts = [p for p in norm.split("/") if p]
    _check_components(parts, path)
    return "\\\\wsl.localhost\\" + distro + ("\\" + "\\".join(parts) if parts else "")


def to_wsl_path(path: str, *, mount_root: str = "/mnt/") -> str:
    """The WSL path for a Windows drive path (``C:\\x\\y`` → ``/mnt/c/x/y``).

    Raises:
        WindowsPathError: ``path`` is not a drive-letter path (UNC paths are not mapped).
    """
    match = re.fullmatch(r"([A-Za-z]):[\\/]*(.*)", path)
    if not match:
        raise WindowsPathError(f"{path!r} is not a Windows drive path (like C:\\Users\\me\\python.exe)")
    root = mount_root if mount_root.endswith("/") else mount_root + "/"
    rest = "/".join(p for p in re.split(r"[\\/]+", match.group(2)) if p)
    return root + match.group(1).lower() + ("/" + rest if rest else "")


@dataclass(frozen=True)
class ConnectBack:
    """Where the client listens and the address the Windows worker connects to."""

    bind_host: str
    connect_host: str
    why: str


def parse_networking_mode(wslinfo_output: str | None, wslconfig: str | None = None) -> str:
    """``nat`` or ``mirrored`` (or another mode WSL names).

    Args:
        wslinfo_output: what ``wslinfo --networking-mode`` printed (WSL ≥ 2.0), if anything.
        wslconfig: the text of ``%UserProfile%\\.wslconfig`` (``[wsl2] networkingMode=``).
    """
    if wslinfo_output and wslinfo_output.strip():
        return wslinfo_output.strip().splitlines()[0].strip().lower()
    section = ""
    for raw in (wslconfig or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip().lower()
        elif section == "wsl2" and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            if key.lower() == "networkingmode" and value:
                return value.strip("\"'").lower()
    return "nat"


def _routes(ip_route: str) -> list[dict[str, str]]:
    rows = []
    for line in ip_route.splitlines():
        words = line.split()
        if not words:
            continue
        row = {"dest": words[0]}
        for key, value in zip(words[1:], words[2:]):  # noqa: B905 (pairs overlap on purpose)
            if key in {"via", "dev", "src", "proto", "scope"} and key not in row:
                row[key] = value
        rows.append(row)
    return rows


def vm_address(ip_route: str) -> str | None:
    """The WSL VM's own address on the interface that carries its default route.

    Read from ``ip route`` output: the default route names the device, and that device's
    link route names the ``src`` address (``172.29.16.0/20 dev eth0 ... src 172.29.20.5``).
    """
    rows = _routes(ip_route)
    dev = next((r.get("dev") for r in rows if r["dest"] == "default"), None)
    for row in rows:
        if row.get("src") and (dev is None or row.get("dev") == dev):
            return row["src"]
    return None


def windows_host_address(ip_route: str, resolv_conf: str | None = None) -> str | None:
    """The Windows host as seen from a NAT-mode WSL VM: the default gateway.

    Falls back to the first ``nameserver`` of ``/etc/resolv.conf`` (which WSL generates
    pointing at the host) when ``ip route`` names no gateway.
    """
    for row in _routes(ip_route):
        if row["dest"] == "default" and row.get("via"):
            return row["via"]
    for line in (resolv_conf or "").splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            return words[1]
    return None


def connect_back(*, networking_mode: str, ip_route: str) -> ConnectBack:
    """The address a Windows worker can reach the WSL client on.

    Mirrored networking shares the host's loopback, so ``127.0.0.1``. In NAT mode the
    Windows host reaches the VM at the VM's own address on its default interface (the
    gateway address is the *host*, the wrong direction).

    Raises:
        XstageError: NAT mode and ``ip route`` names no address for this VM.
    """
    if networking_mode == "mirrored":
        return ConnectBack("127.0.0.1", "127.0.0.1", "mirrored networking shares loopback")
    address = vm_address(ip_route)
    if address is None:
        raise XstageError(
            "cannot tell which address a Windows process reaches this WSL VM on: "
            "`ip route` names no source address on the default interface",
            remedy="set networkingMode=mirrored in %UserProfile%\\.wslconfig, or check `ip route` inside WSL",
        )
    ipaddress.ip_address(address)  # a malformed address is a bug in the input, keep it loud
    return ConnectBack(address, address, "NAT networking: the VM's address on its default interface")


def kill_tree_argv(windows_pid: int) -> list[str]:
    """The command that ends a Windows process and every process it started.

    ``windows_pid`` is the pid *on Windows* (the worker reports ``os.getpid()`` in its
    hello), not the pid of the interop relay process that WSL shows.

    Raises:
        ValueError: the pid is not a positive integer.
    """
    if isinstance(windows_pid, bool) or not isinstance(windows_pid, int) or windows_pid <= 0:
        raise ValueError(f"not a Windows process id: {windows_pid!r}")
    return ["taskkill.exe", "/T", "/F", "/PID", str(windows_pid)]


def wslenv_with(names: Iterable[str], current_wslenv: str | None) -> str:
    """``WSLENV`` extended so ``names`` cross into the Windows process unchanged.

    Interop passes only the variables ``WSLENV`` lists; ``/u`` passes them WSL → Windows
    only, without path translation (right for a secret).
    """
    entries = [e for e in (current_wslenv or "").split(":") if e]
    have = {e.split("/", 1)[0] for e in entries}
    for name in names:
        if name not in have:
            entries.append(f"{name}/u")
            have.add(name)
    return ":".join(entries)
