"""Starting and talking to workers: the only place (with ``routes``) that starts processes."""

from xstage.client.deadlines import Deadlines
from xstage.client.worker import WorkerClient, WorkerState

__all__ = ["Deadlines", "WorkerClient", "WorkerState"]
