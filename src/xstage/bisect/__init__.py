"""``xstage bisect``: which contiguous regions of a graph a route's partitioner takes whole.

A region is a range of one stable topological order of the graph (``graph``); the search that
finds them is pure and asks an oracle (``search``); each probe opens the region as a stage on
the pinned route with the same proof and gate as ``xstage external`` (``probe``); the record is
its own kind with its own schema (``record``); ``--out`` writes the split artifact, and
``run_split`` runs it (``split``). docs/bisect.md is the user's page.

.. versionadded:: 0.3
"""

from __future__ import annotations

from xstage.bisect.run import BisectResult, bisect
from xstage.bisect.search import probe_bound
from xstage.bisect.split import PartRun, SplitRun, run_split, write_split

__all__ = ["BisectResult", "PartRun", "SplitRun", "bisect", "probe_bound", "run_split",
           "write_split"]
