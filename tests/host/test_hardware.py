"""Device discovery: pure parsers on recorded inputs, and the readers on recorded trees."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from recorded import load_fixture, materialize_sysfs

from xstage.host import hardware as hw


def _proc(tmp_path: Path, cpuinfo: str, version: str = "Linux version 6.1.0 (gcc) #1 SMP") -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(cpuinfo)
    (proc / "version").write_text(version)
    return proc


def test_parse_cpuinfo_dev_vm():
    cpu = hw.parse_cpuinfo(load_fixture("dev-vm", "cpuinfo.txt"))
    assert (cpu.vendor_id, cpu.model_name, cpu.logical_cpus) == ("AuthenticAMD", "AMD EPYC", 1)
    assert hw.cpu_vendor(cpu) == "amd"


def test_parse_cpuinfo_h200_host_is_intel():
    cpu = hw.parse_cpuinfo(load_fixture("h200", "cpuinfo-head.txt"))
    assert cpu.model_name == "Intel(R) Xeon(R) Processor"
    assert hw.cpu_vendor(cpu) == "intel"


def test_parse_cpuinfo_arm_implementer():
    cpu = hw.parse_cpuinfo("processor\t: 0\nCPU implementer\t: 0x51\nprocessor\t: 1\n")
    assert (cpu.vendor_id, cpu.logical_cpus, hw.cpu_vendor(cpu)) == ("Qualcomm", 2, "qualcomm")


def test_host_row_reports_ram_in_host_pool():
    cpu = hw.parse_cpuinfo(load_fixture("dev-vm", "cpuinfo.txt"))
    row = hw.host_device(cpu, total_bytes=25276059648, available_bytes=24828407808)
    assert (row.id, row.kind, row.pool, row.memory_bytes, row.available_bytes) == (
        "cpu",
        "cpu",
        "host_ram",
        25276059648,
        24828407808,
    )


def test_dev_vm_sysfs_has_no_gpu(tmp_path):
    root = materialize_sysfs(load_fixture("dev-vm", "sysfs-pci.txt"), tmp_path / "pci")
    assert hw.read_pci_functions(root) == []


def test_h200_sysfs_shows_one_nvidia_gpu(tmp_path):
    root = materialize_sysfs(load_fixture("h200", "sysfs-pci.txt"), tmp_path / "pci")
    functions = hw.read_pci_functions(root)
    assert [(f.address, f.class_code, f.vendor_id, f.device_id, f.driver) for f in functions] == [
        ("0000:00:06.0", 0x030200, 0x10DE, 0x2335, "nvidia")
    ]
    cpu = hw.parse_cpuinfo(load_fixture("h200", "cpuinfo-head.txt"))
    (row,) = hw.classify_pci(functions, cpu=cpu)
    assert (row.id, row.kind, row.vendor, row.pool, row.pci_address) == (
        "gpu_discrete:nvidia:0",
        "gpu_discrete",
        "nvidia",
        "vram:gpu_discrete:nvidia:0",
        "0000:00:06.0",
    )


def test_parse_nvidia_smi_recorded_line():
    (gpu,) = hw.parse_nvidia_smi(load_fixture("h200", "nvidia-smi-query.txt"))
    assert gpu.index == 0
    assert gpu.name == "NVIDIA H200"
    assert gpu.pci_address == "0000:00:06.0"
    assert gpu.memory_total_bytes == 143771 * 2**20
    assert gpu.memory_free_bytes == 143156 * 2**20
    assert gpu.uuid == "GPU-cfbc4be8-da62-f773-fc0d-d705a777b8e4"
    assert gpu.driver_version == "580.159.04"


def test_parse_nvidia_smi_rejects_wrong_field_count():
    with pytest.raises(ValueError, match="has 2 fields, expected 7"):
        hw.parse_nvidia_smi("0, NVIDIA H200\n")


def test_normalize_pci_address():
    assert hw.normalize_pci_address("00000000:00:06.0") == "0000:00:06.0"
    assert hw.normalize_pci_address("0000:C4:00.0") == "0000:c4:00.0"
    assert hw.normalize_pci_address("01:00.1") == "0000:01:00.1"
    with pytest.raises(ValueError):
        hw.normalize_pci_address("GPU-0")


def test_discover_on_recorded_h200_tree(tmp_path):
    """The whole reader path over the H200's recorded /proc, sysfs and nvidia-smi output."""
    proc = _proc(tmp_path, load_fixture("h200", "cpuinfo-head.txt"))
    sys_pci = materialize_sysfs(load_fixture("h200", "sysfs-pci.txt"), tmp_path / "pci")
    rows = hw.discover(
        proc=proc,
        sys_pci=sys_pci,
        dev=tmp_path / "dev",
        nvidia_smi_text=load_fixture("h200", "nvidia-smi-query.txt"),
        wsl=False,
        run_tools=False,
    )
    assert [r.id for r in rows] == ["cpu", "gpu_discrete:nvidia:0"]
    gpu = rows[1]
    assert gpu.name == "NVIDIA H200"
    assert gpu.memory_bytes == 143771 * 2**20 and gpu.available_bytes == 143156 * 2**20
    assert gpu.sources == ("sysfs:0000:00:06.0", "nvidia-smi")
    assert gpu.details["driver"] == "nvidia"


def test_nvidia_smi_alone_adds_the_gpu(tmp_path):
    """A container without /sys still shows the GPU nvidia-smi lists."""
    rows = hw.merge_nvidia([], hw.parse_nvidia_smi(load_fixture("h200", "nvidia-smi-query.txt")))
    assert [(r.id, r.sources) for r in rows] == [("gpu_discrete:nvidia:0", ("nvidia-smi",))]


def test_discover_this_machine_has_a_host_row():
    rows = hw.discover(run_tools=False)
    assert rows[0].id == "cpu"
    assert rows[0].memory_bytes == psutil.virtual_memory().total


def _fn(address, cls, vendor, device, **kw):
    return hw.PciFunction(address=address, class_code=cls, vendor_id=vendor, device_id=device, **kw)


def test_intel_igpu_and_npu_rule():
    """Rule 1 and 4: Intel display on bus 00 is integrated; class 0x12 is the NPU."""
    cpu = hw.CpuInfo("GenuineIntel", "Intel(R) Core(TM) Ultra 7 155H", 22)
    rows = hw.classify_pci(
        [_fn("0000:00:02.0", 0x030000, 0x8086, 0x7D55), _fn("0000:00:0b.0", 0x120000, 0x8086, 0x7D1D)],
        cpu=cpu,
    )
    assert [(r.id, r.pool, r.memory_bytes, r.available_bytes) for r in rows] == [
        ("gpu_integrated:intel", "host_ram", 0, 0),
        ("npu:intel", "host_ram", 0, 0),
    ]


def test_intel_arc_card_off_the_root_bus_is_discrete():
    cpu = hw.CpuInfo("GenuineIntel", "Intel(R) Core(TM) i9", 8)
    (row,) = hw.classify_pci([_fn("0000:03:00.0", 0x030000, 0x8086, 0x56A0)], cpu=cpu)
    assert row.id == "gpu_discrete:intel:0"


def test_amd_apu_rule():
    """Rule 2: a Radeon-graphics CPU's small-VRAM AMD GPU is integrated; a big card is not."""
    cpu = hw.CpuInfo("AuthenticAMD", "AMD Ryzen AI 9 HX 370 w/ Radeon 890M", 24)
    rows = hw.classify_pci(
        [
            _fn("0000:c4:00.0", 0x030000, 0x1002, 0x150E, vram_total=512 << 20, vram_used=100 << 20),
            _fn("0000:c5:00.1", 0x118000, 0x1022, 0x17F0),  # not 0x03/0x12: filtered by the reader
            _fn("0000:c6:00.1", 0x120000, 0x1022, 0x17F0),
            _fn("0000:03:00.0", 0x030000, 0x1002, 0x744C, vram_total=24 << 30, vram_used=1 << 30),
        ],
        cpu=cpu,
    )
    by_id = {r.id: r for r in rows}
    assert set(by_id) == {"gpu_integrated:amd", "npu:amd", "gpu_discrete:amd:0"}
    assert by_id["gpu_integrated:amd"].memory_bytes == 0
    assert by_id["gpu_discrete:amd:0"].memory_bytes == 24 << 30
    assert by_id["gpu_discrete:amd:0"].available_bytes == 23 << 30
    assert by_id["gpu_discrete:amd:0"].pool == "vram:gpu_discrete:amd:0"


def test_unknown_vendors_are_skipped():
    """Rule 5: a virtual display adapter (virtio-gpu) is not a GPU xstage can use."""
    assert (
        hw.classify_pci([_fn("0000:00:01.0", 0x030000, 0x1AF4, 0x1050)], cpu=hw.CpuInfo(None, None, 1)) == []
    )


def test_windows_query_laptop_890m_and_npu():
    """Transcribed (tests/fixtures/README.md): a Ryzen AI laptop as Windows lists it."""
    adapters = hw.parse_windows_query(load_fixture("windows", "query-890m-npu.txt"))
    assert [(a.kind, a.vendor, a.pci_device_id) for a in adapters] == [
        ("gpu", "amd", 0x150E),
        ("gpu", None, None),  # Microsoft Remote Display Adapter: no vendor xstage drives
        ("npu", "amd", 0x17F0),
    ]
    rows = hw.windows_devices(adapters)
    assert [(r.id, r.pool, r.memory_bytes, r.name) for r in rows] == [
        ("gpu_integrated:amd", "host_ram", 0, "AMD Radeon(TM) 890M Graphics"),
        ("npu:amd", "host_ram", 0, "NPU Compute Accelerator Device"),
    ]
    assert rows[0].details["seen_from"] == "windows"


def test_windows_query_single_object_and_empty_npu_list():
    """``ConvertTo-Json`` prints one object without brackets, and nothing for no rows."""
    rows = hw.windows_devices(hw.parse_windows_query(load_fixture("windows", "query-single-dgpu.txt")))
    (row,) = rows
    assert (row.id, row.vendor, row.memory_bytes) == ("gpu_discrete:nvidia:0", "nvidia", 4293918720)
    assert "memory_capped" in row.details


def test_windows_query_rejects_garbage():
    with pytest.raises(ValueError):
        hw.parse_windows_query("Get-CimInstance : not recognized\n")


def test_discover_under_wsl_adds_windows_rows(tmp_path):
    proc = _proc(
        tmp_path, load_fixture("dev-vm", "cpuinfo.txt"), load_fixture("wsl", "proc-version-wsl2.txt")
    )
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "dxg").write_text("")
    rows = hw.discover(
        proc=proc,
        sys_pci=tmp_path / "no-sysfs",
        dev=dev,
        windows_text=load_fixture("windows", "query-890m-npu.txt"),
        run_tools=False,
    )
    assert [r.id for r in rows] == ["cpu", "gpu_integrated:amd", "npu:amd"]
    assert rows[1].details["dev_dxg"] is True


def test_dev_nodes(tmp_path):
    (tmp_path / "accel").mkdir()
    (tmp_path / "accel" / "accel0").write_text("")
    (tmp_path / "dri").mkdir()
    (tmp_path / "dri" / "renderD128").write_text("")
    (tmp_path / "dri" / "card0").write_text("")
    (tmp_path / "nvidia0").write_text("")
    (tmp_path / "nvidiactl").write_text("")
    assert hw.dev_nodes(tmp_path) == {
        "accel": ["accel0"],
        "dri_render": ["renderD128"],
        "dxg": False,
        "nvidia": ["nvidia0"],
    }


def test_vendor_names():
    assert hw.vendor_from_id(0x10DE) == "nvidia" and hw.vendor_from_id(0x1022) == "amd"
    assert hw.vendor_from_id(0x4D4F4351) == "qualcomm"
    assert hw.vendor_from_name("Advanced Micro Devices, Inc.") == "amd"
    assert hw.vendor_from_name("Intel Corporation") == "intel"
    assert hw.vendor_from_name("Microsoft") is None


def test_windows_query_is_cached_per_boot(tmp_path, monkeypatch):
    calls = []

    def fake_query(timeout: float = 20.0):
        calls.append(timeout)
        return load_fixture("windows", "query-890m-npu.txt")

    monkeypatch.setattr(hw, "run_windows_query", fake_query)
    monkeypatch.setattr(hw, "run_nvidia_smi", lambda timeout=10.0: None)
    proc = _proc(
        tmp_path, load_fixture("dev-vm", "cpuinfo.txt"), load_fixture("wsl", "proc-version-wsl2.txt")
    )
    (proc / "sys" / "kernel" / "random").mkdir(parents=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("6f1c5a1e-0000-4000-8000-000000000001\n")
    kw = dict(proc=proc, sys_pci=tmp_path / "none", dev=tmp_path / "dev")
    first = hw.discover(**kw)
    second = hw.discover(**kw)
    third = hw.discover(**kw, refresh=True)
    assert [r.id for r in first] == [r.id for r in second] == [r.id for r in third]
    assert "npu:amd" in [r.id for r in first]
    assert len(calls) == 2  # the second run read the cache; --refresh asked again
