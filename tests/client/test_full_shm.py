"""A full ``/dev/shm`` and another user's names in it: named regions fail by name, never SIGBUS.

Each case runs in a private mount namespace with a tiny tmpfs on ``/dev/shm``
(``tests/mountns.py``; skipped, saying why, where that is not permitted).
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from tests.mountns import in_tiny_tmpfs

CALLS = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    from xstage import builtin_graphs
    from xstage.client import WorkerClient
    g = builtin_graphs.write(builtin_graphs.slice_graph(1 << 20, 1 << 19), sys.argv[1])
    x = np.arange(1 << 20, dtype=np.float32)
    with WorkerClient(sys.executable, shm_mode="named") as w:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            w.load(g)
        print("region", w.link.region is not None)
        print("warned", "; ".join(str(m.message) for m in seen))
        for _ in range(3):
            assert np.array_equal(w.run({"x": x})["y"], x[: 1 << 19])
    print("ok")
""")

CREATE = textwrap.dedent("""
    import os
    from xstage_remote import shm
    slots, size = shm.plan_layout([("x", "float32", 1 << 20)], [("y", "float32", 1 << 20)])
    try:
        shm.Region.create(size, slots, "named")
    except shm.RegionSpaceError as exc:
        print("named", exc.errno, exc.filename)
    print("left", sorted(os.listdir("/dev/shm")))
""")


def test_a_full_dev_shm_sends_tensors_inline_not_sigbus(tmp_path: Path) -> None:
    """A 4 MiB-in / 2 MiB-out stage with a named region on a 1 MiB ``/dev/shm``: before, the
    sparse region mapped and the client died of SIGBUS at its first input; now the region is
    refused at creation, one warning says so, and every call is answered inline, right."""
    script = tmp_path / "calls.py"
    script.write_text(CALLS)
    done = in_tiny_tmpfs("/dev/shm", "1m", [sys.executable, str(script), str(tmp_path / "g.onnx")])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert "region False" in lines and lines[-1] == "ok"
    warned = next(line for line in lines if line.startswith("warned"))
    assert "no room for a" in warned and "/dev/shm" in warned and "travel inline" in warned


def test_region_create_on_a_full_dev_shm_is_a_named_error(tmp_path: Path) -> None:
    """``Region.create`` itself: ``RegionSpaceError`` (ENOSPC) naming the file, which is gone."""
    script = tmp_path / "create.py"
    script.write_text(CREATE)
    done = in_tiny_tmpfs("/dev/shm", "1m", [sys.executable, str(script)])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    named = next(line for line in done.stdout.splitlines() if line.startswith("named"))
    assert named.split()[1] == "28" and named.split()[2].startswith("/dev/shm/xstage-")
    assert done.stdout.splitlines()[-1] == "left []"


PLANTED = textwrap.dedent("""
    import os, subprocess, sys

    def as_uid(uid):
        def drop():
            os.setgroups([]); os.setgid(uid); os.setuid(uid)
        return drop

    # The attacker (uid 65534) plants a name whose creator is gone: 99999999 is past any
    # pid_max (2^22). The victim is this interpreter's owner without its capabilities (no
    # CAP_FOWNER: as any other user, it may not remove another's file in the sticky folder,
    # which belongs to a third uid), so it can still read its own interpreter and packages.
    os.chown("/dev/shm", 65533, 65533)
    subprocess.run(["/bin/sh", "-c", "touch /dev/shm/xstage-99999999-0123456789ab"],
                   preexec_fn=as_uid(65534), check=True)
    assert os.stat("/dev/shm/xstage-99999999-0123456789ab").st_uid == 65534
    victim = subprocess.run(["setpriv", "--bounding-set", "-all", "--inh-caps", "-all",
                             sys.executable, "-c", sys.argv[1]], capture_output=True, text=True)
    print(victim.stdout + victim.stderr)
    print("left", sorted(os.listdir("/dev/shm")))
""")

VICTIM = textwrap.dedent("""
    from xstage_remote import shm
    slots, size = shm.plan_layout([("x", "float32", 1024)], [("y", "float32", 1024)])
    region = shm.Region.create(size, slots, "named")
    region.handed_over()
    region.close()
    print("created")
""")


@pytest.mark.skipif(shutil.which("setpriv") is None,
                    reason="needs util-linux's setpriv to run the victim without capabilities")
def test_another_users_stale_name_does_not_break_named_regions(tmp_path: Path) -> None:
    """uid 65534 plants ``/dev/shm/xstage-<dead pid>-…`` in the sticky ``/dev/shm``: the sweep
    cannot remove it (EPERM) and skips it; before, every named-region open raised
    ``PermissionError`` from the sweep. The victim runs without capabilities (root's
    CAP_FOWNER removes any name); the suite's root sets the scene in a private mount
    namespace: a fresh ``/dev/shm`` no neighbour's sweep touches."""
    script = tmp_path / "planted.py"
    script.write_text(PLANTED)
    done = in_tiny_tmpfs("/dev/shm", "1m", [sys.executable, str(script), VICTIM], as_root=True)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert "created" in lines, done.stdout[-2000:]
    assert lines[-1] == "left ['xstage-99999999-0123456789ab']"
