"""Reports of records: an HTML page, Model Explorer node data, a Perfetto trace, a comparison.

``view`` turns a record into a view model (pure); ``html`` renders it as one self-contained
page with the plots of ``plots`` inline as SVG (matplotlib, the ``report`` extra); ``node_data``
and ``trace`` write the formats of Model Explorer and Perfetto. docs/reports.md shows them.
"""

from __future__ import annotations

from xstage.report.view import CompareView, ReportView, build_view, compare_views

__all__ = ["CompareView", "ReportView", "build_view", "compare_views"]
