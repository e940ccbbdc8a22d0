"""``python -m xstage``."""

from .cli.main import entry

entry()
