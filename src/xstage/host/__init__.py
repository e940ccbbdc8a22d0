"""Facts about the machine this process runs on: its devices (``hardware``) and WSL (``wsl``)."""

__all__: list[str] = []
