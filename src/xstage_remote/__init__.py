"""The worker side of xstage: the wire protocol and the runtimes that run inside a route's
interpreter.

This package imports nothing from ``xstage``, needs only the standard library, numpy and the
route's runtime, and keeps to Python 3.9 syntax: the client copies it alone onto a foreign
interpreter's path. The client imports the same ``wire`` module, so there is one
implementation of the protocol.
"""

import hashlib
import os

__all__ = ["PROTOCOL_VERSION", "package_hash"]

#: Bumped on any incompatible change to docs/wire.md (2: request ids and generations).
PROTOCOL_VERSION = 2

_HASH = None


def package_hash():
    """sha256 over this package's source files (sorted relative paths and contents)."""
    global _HASH
    if _HASH is None:
        root = os.path.dirname(os.path.abspath(__file__))
        h = hashlib.sha256()
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if not (name.endswith(".py") or name.endswith(".json")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                h.update(rel.encode("utf-8") + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
                h.update(b"\0")
        _HASH = h.hexdigest()
    return _HASH
