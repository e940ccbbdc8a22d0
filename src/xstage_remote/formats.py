"""What kind of file an artifact is, by its contents; standard library only.

The client (``xstage.artifact``) and the worker (``torch_runtime``) both ask, so it lives here,
in the one module beside ``wire`` that the client shares with this package.
"""

import zipfile

__all__ = ["is_torchscript"]


def is_torchscript(path):
    """A TorchScript archive: code and constants, and no torch.export ``archive_format``."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    has_pt2 = any(n.endswith("/archive_format") for n in names)
    return not has_pt2 and any(n.endswith("/constants.pkl") or "/code/" in n for n in names)
