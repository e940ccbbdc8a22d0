"""WSL → Windows as pure functions over recorded (transcribed) inputs; none of it runs here."""

from __future__ import annotations

import pytest
from recorded import load_fixture

from xstage.host import wsl
from xstage.host.wsl import WindowsPathError

WSL2 = load_fixture("wsl", "proc-version-wsl2.txt")
WSL1 = load_fixture("wsl", "proc-version-wsl1.txt")
DEV_VM = "Linux version 6.18.44-fc-v857 (builder@sandboxing) (gcc (GCC) 15.3.0) #1 SMP PREEMPT_DYNAMIC @0"


def test_detect_wsl2_with_interop():
    info = wsl.detect(
        proc_version=WSL2,
        binfmt_entries={"WSLInterop": "enabled\ninterpreter /init\nflags: PF\n"},
        environ={"WSL_DISTRO_NAME": "Ubuntu-24.04", "WSL_INTEROP": "/run/WSL/1_interop"},
    )
    assert (info.is_wsl, info.version, info.interop, info.distro) == (True, 2, True, "Ubuntu-24.04")
    assert any("WSLInterop: enabled" in e for e in info.evidence)


def test_detect_wsl_interop_late_entry_counts():
    """Newer WSL registers the handler as ``WSLInterop-late``."""
    info = wsl.detect(proc_version=WSL2, binfmt_entries={"WSLInterop-late": "enabled\n"}, environ={})
    assert info.interop


def test_detect_wsl2_with_interop_disabled():
    info = wsl.detect(proc_version=WSL2, binfmt_entries={"WSLInterop": "disabled\n"}, environ={})
    assert info.is_wsl and not info.interop


def test_detect_wsl2_without_binfmt_entry_is_not_interop():
    assert not wsl.detect(proc_version=WSL2, binfmt_entries={}, environ={}).interop


def test_detect_wsl1():
    info = wsl.detect(proc_version=WSL1, binfmt_entries={"WSLInterop": "enabled"}, environ={})
    assert (info.is_wsl, info.version) == (True, 1)


def test_detect_plain_linux_ignores_stray_variables():
    info = wsl.detect(proc_version=DEV_VM, binfmt_entries={}, environ={"WSL_INTEROP": "/x"})
    assert not info.is_wsl and not info.interop


def test_current_on_this_machine_is_not_wsl():
    assert not wsl.current().is_wsl


@pytest.mark.parametrize(
    ("linux", "windows"),
    [
        ("/mnt/c/Users/me/model.onnx", "C:\\Users\\me\\model.onnx"),
        ("/mnt/d", "D:\\"),
        ("/mnt/c/", "C:\\"),
        ("/mnt/c/a/./b/../model.onnx", "C:\\a\\model.onnx"),
        ("/home/me/x.onnx", "\\\\wsl.localhost\\Ubuntu\\home\\me\\x.onnx"),
        ("/mnt/cd/x", "\\\\wsl.localhost\\Ubuntu\\mnt\\cd\\x"),  # not a drive: a folder named cd
        ("/", "\\\\wsl.localhost\\Ubuntu"),
    ],
)
def test_to_windows_path(linux, windows):
    assert wsl.to_windows_path(linux, distro="Ubuntu") == windows


def test_to_windows_path_honours_automount_root():
    root = wsl.automount_root(load_fixture("wsl", "wsl.conf"))
    assert root == "/win/"
    assert wsl.to_windows_path("/win/e/data/a.npy", distro="U", mount_root=root) == "E:\\data\\a.npy"
    assert wsl.to_windows_path("/mnt/e/a", distro="U", mount_root=root).startswith("\\\\wsl.localhost\\U\\")


def test_automount_root_default():
    assert wsl.automount_root(None) == "/mnt/"
    assert wsl.automount_root("[automount]\nenabled=true\n") == "/mnt/"


def test_rejects_linux_path_without_distro():
    with pytest.raises(WindowsPathError) as err:
        wsl.to_windows_path("/home/me/model.onnx", distro=None)
    assert str(err.value) == (
        "cannot hand '/home/me/model.onnx' to a Windows process: it is inside the Linux "
        "filesystem and the WSL distribution name is unknown (WSL_DISTRO_NAME is not set)"
    )


def test_rejects_relative_path():
    with pytest.raises(WindowsPathError, match="relative path 'model.onnx'"):
        wsl.to_windows_path("model.onnx", distro="Ubuntu")


@pytest.mark.parametrize("name", ["a:b.onnx", "what?.onnx", "x|y", "back\\slash", "tab\there"])
def test_rejects_names_windows_cannot_hold(name):
    with pytest.raises(WindowsPathError, match="Windows paths cannot contain"):
        wsl.to_windows_path(f"/mnt/c/{name}", distro="Ubuntu")


@pytest.mark.parametrize(
    ("windows", "linux"),
    [
        ("C:\\Users\\me\\venv\\Scripts\\python.exe", "/mnt/c/Users/me/venv/Scripts/python.exe"),
        ("d:/x/y", "/mnt/d/x/y"),
        ("E:\\", "/mnt/e"),
    ],
)
def test_to_wsl_path(windows, linux):
    assert wsl.to_wsl_path(windows) == linux


def test_to_wsl_path_rejects_unc():
    with pytest.raises(WindowsPathError, match="not a Windows drive path"):
        wsl.to_wsl_path("\\\\server\\share\\python.exe")


def test_connect_back_nat_uses_the_vm_address():
    cb = wsl.connect_back(networking_mode="nat", ip_route=load_fixture("wsl", "ip-route-nat.txt"))
    assert (cb.bind_host, cb.connect_host) == ("172.29.20.5", "172.29.20.5")


def test_connect_back_mirrored_uses_loopback():
    cb = wsl.connect_back(networking_mode="mirrored", ip_route=load_fixture("wsl", "ip-route-mirrored.txt"))
    assert (cb.bind_host, cb.connect_host) == ("127.0.0.1", "127.0.0.1")


def test_connect_back_nat_without_source_address_fails_loudly():
    with pytest.raises(wsl.XstageError, match="names no source address"):
        wsl.connect_back(networking_mode="nat", ip_route="default via 10.0.0.1 dev eth0\n")


def test_windows_host_address_from_gateway_then_resolv_conf():
    assert wsl.windows_host_address(load_fixture("wsl", "ip-route-nat.txt")) == "172.29.16.1"
    assert wsl.windows_host_address("", load_fixture("wsl", "resolv-conf-nat.txt")) == "172.29.16.1"
    assert wsl.windows_host_address("", "") is None


def test_networking_mode():
    assert wsl.parse_networking_mode("mirrored\n") == "mirrored"
    assert wsl.parse_networking_mode(None, load_fixture("wsl", "wslconfig-mirrored.txt")) == "mirrored"
    assert wsl.parse_networking_mode("", "[wsl2]\nmemory=8GB\n") == "nat"
    assert wsl.parse_networking_mode(None, None) == "nat"


def test_kill_tree_argv():
    assert wsl.kill_tree_argv(4242) == ["taskkill.exe", "/T", "/F", "/PID", "4242"]


@pytest.mark.parametrize("pid", [0, -1, True, "12", 1.5])
def test_kill_tree_rejects_non_pids(pid):
    with pytest.raises(ValueError, match="not a Windows process id"):
        wsl.kill_tree_argv(pid)


def test_wslenv_with():
    assert wsl.wslenv_with(["XSTAGE_SECRET"], None) == "XSTAGE_SECRET/u"
    assert (
        wsl.wslenv_with(["XSTAGE_SECRET"], "USERPROFILE/p:XSTAGE_SECRET/u") == "USERPROFILE/p:XSTAGE_SECRET/u"
    )
    assert wsl.wslenv_with(["A", "B"], "WT_SESSION") == "WT_SESSION:A/u:B/u"
