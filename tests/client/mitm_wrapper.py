"""Stands in for an interpreter and points the worker at the attacker instead of the client.

The attacker test's way of putting a process in the middle of the TCP connect-back: the
worker's ``--connect host:PORT`` becomes ``127.0.0.1:$XSTAGE_ATTACK_PORT``, and the real
port is told to the attacker first (a line on a connection of its own). Everything else is
the real worker, exec'd with the real interpreter: its stdin (the secret) is inherited.
"""

import os
import socket
import sys

argv = sys.argv[1:]
attack_port = int(os.environ["XSTAGE_ATTACK_PORT"])
i = argv.index("--connect")
real_port = argv[i + 1].rpartition(":")[2]
with socket.create_connection(("127.0.0.1", attack_port), timeout=10) as tell:
    tell.sendall(real_port.encode() + b"\n")
argv[i + 1] = f"127.0.0.1:{attack_port}"
os.execv(sys.executable, [sys.executable] + argv)
