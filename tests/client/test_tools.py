"""``run_tool``: the one helper that runs machine tools for ``xstage.host``."""

from __future__ import annotations

import sys

from xstage.client.tools import run_tool


def test_what_a_tool_prints():
    assert run_tool([sys.executable, "-c", "print('hi')"], 60) == "hi\n"


def test_absent_failing_and_slow_tools_say_none():
    assert run_tool(["xstage-no-such-tool-here"], 5) is None
    assert run_tool([sys.executable, "-c", "print('x'); raise SystemExit(3)"], 60) is None
    assert run_tool([sys.executable, "-c", "import time; time.sleep(30)"], 0.5) is None


def test_unchecked_keeps_a_failing_tools_output():
    assert run_tool([sys.executable, "-c", "print('x'); raise SystemExit(3)"], 60, check=False) == "x\n"
    assert run_tool(["xstage-no-such-tool-here"], 5, check=False) is None
