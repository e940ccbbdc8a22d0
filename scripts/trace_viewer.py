"""Open an ``xstage report --trace`` file in the Trace Viewer that ``chrome://tracing`` is, and
screenshot it.

Why this and not Perfetto: the Perfetto UI is a web page and its Python trace processor downloads
its shell at first use; the machine this was written on reaches neither. Debian's Chromium does not
serve ``chrome://tracing`` (``ERR_FAILED``, even with internal debugging pages enabled). The viewer
behind ``chrome://tracing`` is Catapult's Trace Viewer, and Catapult's own ``trace2html`` writes it
and a trace into one offline page: that page, opened in headless Chromium, is the tool reading our
file — its importer, its track layout, its slice nesting, its argument panel.

The page is zoomed to the profiled runs and one slice is selected (by default the first kernel
that ran on the CPU EP, else the first kernel) so the screenshot shows the nesting and the
selected kernel's arguments (op, provider, run). The selection is made by the viewer's own
selection API after it imported the file; nothing in the trace is edited.

Run::

    python scripts/trace_viewer.py TRACE.json --catapult PATH/TO/catapult --png OUT.png

``--catapult`` is a checkout of https://github.com/catapult-project/catapult (its ``tracing/``
and ``third_party/`` folders; no build step).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Runs in the page once the viewer has imported the trace: zoom to the profiled runs, select one
# kernel slice, and write what the viewer holds into the title (read back by --check).
_DRIVE = """
<script>
function drive() {
  const view = tr.ui.b.findDeepElementMatching(document.body, 'tr-ui-timeline-view');
  const ready = view && view.model && view.trackView && view.trackView.clientWidth;
  if (!ready) { setTimeout(drive, 250); return; }
  if (!window.settled) { window.settled = true; setTimeout(drive, 1000); return; }  // after its zoom-to-fit
  const track = view.trackView, model = view.model;
  const slices = [];
  for (const proc of Object.values(model.processes))
    for (const thread of Object.values(proc.threads))
      for (const s of thread.sliceGroup.slices) slices.push(s);
  const runs = slices.filter(s => s.title.startsWith('profiled run'));
  const kernels = slices.filter(s => s.category.startsWith('kernel'));
  const pick = kernels.find(s => s.category === 'kernel,cpu') || kernels[0];
  if (runs.length) {
    const lo = Math.min(...runs.map(s => s.start)), hi = Math.max(...runs.map(s => s.end));
    const pad = (hi - lo) * 0.08;
    const dt = new tr.ui.TimelineDisplayTransform();
    dt.set(track.viewport.currentDisplayTransform);
    dt.xSetWorldBounds(lo - pad, hi + pad, track.clientWidth - 250);
    track.viewport.setDisplayTransformImmediately(dt);
  }
  if (pick) view.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet([pick]));
  document.title = JSON.stringify({
    processes: Object.values(model.processes).map(p => p.userFriendlyName),
    slices: slices.length, runs: runs.length, kernels: kernels.length,
    nested: kernels.filter(k => k.parentSlice && k.parentSlice.title.startsWith('profiled run')).length,
    counters: Object.values(model.processes).reduce((n, p) => n + Object.keys(p.counters).length, 0),
    selected: pick ? {title: pick.title, cat: pick.category, args: pick.args} : null,
  });
}
window.addEventListener('load', () => setTimeout(drive, %(delay_ms)d));
</script>
"""


def viewer_page(trace: Path, catapult: Path, html: Path, delay_ms: int = 500) -> None:
    """Catapult's ``trace2html`` on ``trace``, with the driving script appended."""
    subprocess.run(
        [sys.executable, str(catapult / "tracing" / "bin" / "trace2html"), str(trace), "--output", str(html)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with open(html, "a") as f:
        f.write(_DRIVE % {"delay_ms": delay_ms})


class _DevTools:
    """Chromium driven over ``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated JSON): the
    standard library is enough, and the viewer's import runs in real time (``--virtual-time-budget``
    stalls it at "Importing...")."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()

        # The child sees our pipe ends as its fds 3 (reads commands) and 4 (writes replies).
        def plumb() -> None:
            # Through two high numbers first: a pipe end may already be fd 3 or 4, and dup2 onto
            # a different number is what clears close-on-exec.
            high_in, high_out = os.dup2(to_browser, 200), os.dup2(from_browser, 201)
            os.dup2(high_in, 3)
            os.dup2(high_out, 4)

        self._proc = subprocess.Popen(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "--window-size=1100,700",
                "--force-device-scale-factor=1",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=plumb,
            close_fds=False,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._ids = itertools.count(1)
        self._buf = b""
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def send(self, method: str, session: bool = False, **params: Any) -> dict:
        mid = next(self._ids)
        msg = {"id": mid, "method": method, "params": params}
        if session:
            msg["sessionId"] = self._session
        os.write(self._write, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed its DevTools pipe")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == mid:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait(timeout=30)
        os.close(self._read)
        os.close(self._write)


def open_in_viewer(chromium: str, html: Path, png: Path | None, wait_s: float = 60.0) -> dict:
    """Load the viewer page, wait for the driving script to report, screenshot, return the report."""
    with tempfile.TemporaryDirectory() as profile:
        tools = _DevTools(chromium, profile)
        try:
            tools.send("Page.navigate", session=True, url=html.as_uri())
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                title = tools.send(
                    "Runtime.evaluate", session=True, expression="document.title", returnByValue=True
                )["result"].get("value", "")
                if title.startswith("{"):
                    break
                time.sleep(0.25)
            else:
                raise RuntimeError(f"the viewer did not finish importing in {wait_s:.0f} s (title {title!r})")
            time.sleep(0.5)  # one more frame for the selection panel
            if png is not None:
                shot = tools.send("Page.captureScreenshot", session=True, format="png")["data"]
                png.write_bytes(base64.b64decode(shot))
            return json.loads(title)
        finally:
            tools.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="a file written by `xstage report --trace`")
    ap.add_argument("--catapult", type=Path, required=True, help="a checkout of catapult-project/catapult")
    ap.add_argument("--png", type=Path, help="where the screenshot goes")
    ap.add_argument("--html", type=Path, help="keep the viewer page here (default: a temp file)")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        html = args.html or Path(tmp) / "trace.html"
        viewer_page(args.trace, args.catapult, html)
        print(json.dumps(open_in_viewer(args.chromium, html, args.png), indent=1))
        if args.png:
            print(f"screenshot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
