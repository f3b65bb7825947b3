"""Free TCP ports on 127.0.0.1 for child servers (tritonserver rejects port 0)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS reports free right now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """One port the OS reports free right now."""
    return free_ports(1)[0]
