"""Readers for the recorded inputs under tests/fixtures/ (tests/fixtures/README.md says
which are recorded and which are transcribed from documentation)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_fixture(*parts: str) -> str:
    """Text of one fixture file."""
    return FIXTURES.joinpath(*parts).read_text()


def load_json_fixture(*parts: str) -> Any:
    """One JSON fixture file."""
    return json.loads(load_fixture(*parts))


def materialize_sysfs(listing: str, root: Path) -> Path:
    """Rebuild a ``/sys/bus/pci/devices`` tree from a recorded one-line-per-device listing.

    Each line is ``<address> class=0x.. vendor=0x.. device=0x.. boot_vga=.. driver=<name>``;
    the driver becomes a ``driver`` symlink to ``../../bus/pci/drivers/<name>``, as in sysfs.
    """
    root.mkdir(parents=True, exist_ok=True)
    for line in listing.splitlines():
        if not line.strip():
            continue
        address, *pairs = line.split()
        fields = dict(re.findall(r"(\w+)=(\S*)", " ".join(pairs)))
        dev = root / address
        dev.mkdir()
        for name in ("class", "vendor", "device", "boot_vga"):
            if fields.get(name):
                (dev / name).write_text(fields[name] + "\n")
        if fields.get("driver"):
            (dev / "driver").symlink_to(f"../../bus/pci/drivers/{fields['driver']}")
    return root


def runs_timed(raw: list[dict[str, Any]], per_run: list[dict[str, int]]) -> str:
    """A recorded one-run ORT profile repeated into ``len(per_run)`` runs, run k's kernel events
    timed by ``per_run[k]`` (microseconds by provider); each ``model_run`` at least 20 s long, so
    it spans its kernels. The profile text ``prove`` reads."""
    events = []
    for k, durations in enumerate(per_run):
        for e in raw:
            e2 = {**e, "ts": e["ts"] + k * 10**8, "args": dict(e["args"])}
            if e2["cat"] == "Node" and e2["name"].endswith("_kernel_time"):
                e2["dur"] = durations[e2["args"]["provider"]]
            if e2["name"] == "model_run":
                e2["dur"] = max(e2["dur"], 2 * 10**7)
            events.append(e2)
    return json.dumps(events)
