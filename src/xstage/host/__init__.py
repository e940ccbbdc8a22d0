"""Facts about the machine this process runs on: its devices (``hardware``), WSL
(``wsl``), and the summary routes judge against (``info.HostInfo``)."""

__all__: list[str] = []
