"""``python -m xstage``."""

from xstage.cli.main import entry

entry()
