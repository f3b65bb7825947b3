"""preStop hooks of the textscore pod: drain the gateway, then let Triton go.

Standard library only, Python 3.10+: the same file runs in the gateway image (Python 3.11) and in
the Triton image (the NGC image's Python 3.10). The chart mounts it from a ConfigMap.

``drain.py gateway --wait-before P --timeout D --metrics-url URL``
    1. Sleeps ``P`` seconds. A terminating pod leaves the Service's endpoints at once, but
       kube-proxy, ingress controllers and load balancers learn it a few seconds later; requests
       that still arrive meanwhile are served, not refused.
    2. Polls the gateway's ``gateway_requests_in_flight`` gauge until it reads 0, for at most
       ``D`` seconds: the API requests already inside finish.
    Then the hook returns, the kubelet sends SIGTERM, and uvicorn stops listening and closes.

``drain.py triton --port PORT --timeout T``
    Waits until nothing listens on the gateway's port of this pod any more (the gateway has
    exited), for at most ``T`` seconds, so that Triton serves the gateway's last requests. Then
    the kubelet sends SIGTERM to Triton.

Both always exit 0: a failed hook only adds an event, and the kubelet terminates the container
anyway, so there is nothing to gain from a non-zero status.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

IN_FLIGHT = re.compile(r"^gateway_requests_in_flight(?:\{[^}]*\})?\s+(\S+)", re.MULTILINE)


class GatewayGone(Exception):
    """Nothing answers on the gateway's port: it has already stopped."""


def in_flight(metrics_url: str, timeout: float = 2.0) -> float | None:
    """The gateway's in-flight API requests, or None when its metrics cannot be read.

    None covers a protected ``/metrics`` (``GATEWAY_PROTECT_METRICS``) and a missing gauge: the
    caller cannot tell whether requests are still inside and waits the whole timeout.
    """
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            raise GatewayGone from exc
        return None
    except ConnectionRefusedError as exc:
        raise GatewayGone from exc
    except OSError:
        return None
    found = IN_FLIGHT.search(text)
    return float(found.group(1)) if found else None


def drain_gateway(
    wait_before: float,
    timeout: float,
    metrics_url: str,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Wait ``wait_before`` seconds, then until no API request is in flight (at most ``timeout``).

    Returns how the wait ended: ``drained``, ``gone``, ``unknown`` (metrics unreadable, the
    whole timeout waited) or ``timeout``.
    """
    sleep(wait_before)
    deadline = clock() + timeout
    unreadable = False
    while True:
        try:
            count = in_flight(metrics_url)
        except GatewayGone:
            return "gone"
        if count is not None and count <= 0:
            return "drained"
        unreadable = count is None
        remaining = deadline - clock()
        if remaining <= 0:
            return "unknown" if unreadable else "timeout"
        sleep(min(poll, remaining))


def port_open(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port_closed(
    host: str,
    port: int,
    timeout: float,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Wait until nothing listens on ``host:port`` (``closed``) or ``timeout`` seconds pass."""
    deadline = clock() + timeout
    while port_open(host, port):
        remaining = deadline - clock()
        if remaining <= 0:
            return "timeout"
        sleep(min(poll, remaining))
    return "closed"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the hook's arguments and wait; always 0 (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="drain.py", description=__doc__.split("\n\n")[0])
    hooks = parser.add_subparsers(dest="hook", required=True)
    gateway = hooks.add_parser("gateway", help="preStop of the gateway container")
    gateway.add_argument("--wait-before", type=float, required=True)
    gateway.add_argument("--timeout", type=float, required=True)
    gateway.add_argument("--metrics-url", required=True)
    gateway.add_argument("--poll", type=float, default=0.5)
    triton = hooks.add_parser("triton", help="preStop of the Triton container")
    triton.add_argument("--host", default="127.0.0.1")
    triton.add_argument("--port", type=int, required=True)
    triton.add_argument("--timeout", type=float, required=True)
    triton.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args(argv)

    started = time.monotonic()
    if args.hook == "gateway":
        outcome = drain_gateway(args.wait_before, args.timeout, args.metrics_url, args.poll)
    else:
        outcome = wait_port_closed(args.host, args.port, args.timeout, args.poll)
    # The kubelet shows a hook's output only when it fails; this line is for a manual run.
    print(f"drain.py {args.hook}: {outcome} after {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
