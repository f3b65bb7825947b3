"""``python -m gateway models ...``: the model-lifecycle admin API (``/v1/admin/...``) for people.

Lists pipeline versions, loads and unloads them, and changes the traffic policy (canary, shadow,
promote, roll back) over HTTP. The standard library alone (``urllib.request``): the gateway image
ships no HTTP client package, and an operator runs this from inside it or from any Python.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

DEFAULT_URL = "http://127.0.0.1:8000"
# A load answers only once the version is loaded in Triton and warmed up: that can take a minute.
DEFAULT_TIMEOUT_S = 120.0
HISTORY_SHOWN = 10


class AdminApiError(Exception):
    """The gateway answered with an error (its ``{"error": {...}}`` body, or what it sent)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class GatewayUnreachable(Exception):
    """No HTTP answer at all: refused connection, unknown host, timeout."""


@dataclass(frozen=True)
class AdminClient:
    """Calls the admin API of the gateway at ``url`` with an ``admin``-scoped key."""

    url: str
    key: str
    timeout_s: float = DEFAULT_TIMEOUT_S

    def get(self, path: str) -> Any:
        """``GET path``: the decoded JSON answer."""
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        """``POST path`` with ``body`` as JSON (an empty body when None)."""
        return self.request("POST", path, body)

    def delete(self, path: str) -> Any:
        """``DELETE path``: the decoded JSON answer."""
        return self.request("DELETE", path)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call; :class:`AdminApiError` for a non-2xx answer, :class:`GatewayUnreachable`
        when none came."""
        url = self.url.rstrip("/") + path
        headers = {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif method == "POST":
            # An explicit empty body: a POST without Content-Length is refused by some proxies.
            data = b""
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except urllib.error.URLError as exc:
            raise GatewayUnreachable(
                f"cannot reach the gateway at {self.url}: {exc.reason}"
            ) from None
        except TimeoutError:
            raise GatewayUnreachable(
                f"no answer from the gateway at {self.url} within {self.timeout_s:g} s "
                "(raise --timeout for a slow load)"
            ) from None
        except ConnectionError as exc:
            raise GatewayUnreachable(f"connection to {self.url} failed: {exc}") from None


def _api_error(exc: urllib.error.HTTPError) -> AdminApiError:
    raw = exc.read()
    try:
        detail = json.loads(raw)["error"]
        return AdminApiError(exc.code, str(detail["code"]), str(detail["message"]))
    except (ValueError, KeyError, TypeError):
        # Not the gateway's error shape (a proxy in between, or not a gateway at all).
        text = raw.decode(errors="replace").strip()[:200] or str(exc.reason)
        return AdminApiError(exc.code, "http_error", text)


# --- output ---------------------------------------------------------------------------------


def policy_line(policy: dict[str, Any] | None) -> str:
    """The policy in one line: ``stable v1 · canary v2 at 10 % · shadow none · revision 7``."""
    if policy is None:
        return "no traffic policy yet"
    canary = policy.get("canary")
    canary_text = "none" if canary is None else f"v{canary} at {policy['canary_percent']:g} %"
    shadow = policy.get("shadow")
    shadow_share = policy.get("shadow_percent", 100.0)
    shadow_text = "none" if shadow is None else f"v{shadow}"
    if shadow is not None and shadow_share < 100:
        shadow_text += f" at {shadow_share:g} %"
    return (
        f"stable v{policy['stable']} · canary {canary_text} · "
        f"shadow {shadow_text} · revision {policy['revision']}"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in (header, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)


VERSION_HEADER = (
    "VERSION",
    "STATE",
    "ROLES",
    "IN FLIGHT",
    "BUILT AT",
    "SOURCE MODEL",
    "FOREST R^2",
)


def version_row(status: dict[str, Any]) -> list[str]:
    """One version's table row; manifest columns are ``-`` where the manifest lacks them (a
    version not loaded here has no manifest yet)."""
    manifest = status.get("manifest") or {}
    forest = manifest.get("forest")
    r2 = forest.get("r2") if isinstance(forest, dict) else None
    state = status["state"]
    if status.get("reason"):
        state = f"{state} ({status['reason']})"
    return [
        f"v{status['version']}",
        state,
        ",".join(status.get("roles") or []) or "-",
        str(status.get("in_flight", 0)),
        str(manifest.get("built_at") or "-"),
        str(manifest.get("source_model") or "-"),
        f"{r2:.3f}" if isinstance(r2, (int, float)) else "-",
    ]


def format_versions(answer: dict[str, Any]) -> str:
    """``GET /v1/admin/versions`` as a table and the policy line."""
    rows = [version_row(status) for status in answer["versions"]]
    return f"{table(VERSION_HEADER, rows)}\n\npolicy: {policy_line(answer.get('policy'))}"


def format_change(answer: dict[str, Any]) -> str:
    """A policy change's answer: the new policy line and why it changed."""
    policy = answer["policy"]
    return f"policy: {policy_line(policy)}\nreason: {policy['reason']} (by {policy['updated_by']})"


def _when(unix_time: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix_time))


def format_policy(answer: dict[str, Any]) -> str:
    """``GET /v1/admin/policy``: the policy and its last :data:`HISTORY_SHOWN` changes."""
    policy = answer["policy"]
    previous = policy.get("previous_stable")
    lines = [
        f"policy: {policy_line(policy)}",
        f"rollback without a canary returns to: {'nothing' if previous is None else f'v{previous}'}",
        "",
        f"last {min(HISTORY_SHOWN, len(answer['history']))} changes (newest first):",
    ]
    rows = [
        [_when(item["updated_at"]), str(item["revision"]), item["updated_by"], item["reason"]]
        for item in answer["history"][:HISTORY_SHOWN]
    ]
    lines.append(table(("TIME (UTC)", "REVISION", "BY", "REASON"), rows))
    return "\n".join(lines)


# --- commands -------------------------------------------------------------------------------


def add_parser(commands: Any) -> None:
    """Add the ``models`` command (and its actions) to ``python -m gateway``'s subparsers."""
    models = commands.add_parser(
        "models",
        help="pipeline versions and the traffic policy (the admin API)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_options(models, defaults=True)
    actions = models.add_subparsers(dest="action", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=help_text)
        # The options are accepted after the action too (``models list --json``); SUPPRESS keeps
        # an option given before the action from being reset by this parser's default.
        _add_options(parser, defaults=False)
        return parser

    action("list", "versions with state, roles, build manifest; the policy")
    action("load", "load a version in Triton and warm it up").add_argument("version", type=int)
    action("unload", "unload a version (refused while it serves traffic)").add_argument(
        "version", type=int
    )
    canary = action("canary", "send a share of the API keys to a loaded version")
    canary.add_argument("version", type=int)
    canary.add_argument("--percent", type=float, required=True, help="share of the API keys")
    shadow = action("shadow", "copy the traffic to a loaded version (or --off)")
    shadow.add_argument("version", type=int, nargs="?")
    shadow.add_argument("--off", action="store_true", help="stop shadowing")
    shadow.add_argument(
        "--percent",
        type=float,
        default=100.0,
        help="share of the requests copied (default: %(default)s; a copy costs a pipeline run)",
    )
    action("promote", "make the canary stable")
    action("rollback", "drop the canary, or return to the previous stable")
    action("policy", "the traffic policy and its last changes")


def _add_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url", default=default(None), help=f"gateway URL (default: $GATEWAY_URL or {DEFAULT_URL})"
    )
    parser.add_argument(
        "--key", default=default(None), help="API key with the admin scope ($GATEWAY_ADMIN_KEY)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=default(DEFAULT_TIMEOUT_S),
        help="seconds to wait for an answer (default: %(default)s; a load waits for warm-up)"
        if defaults
        else "seconds to wait for an answer",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print the gateway's JSON answer instead",
    )


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one ``models`` action: 0 on success, 1 when the gateway refused or was unreachable,
    2 for a usage error."""
    out = out or sys.stdout
    err = err or sys.stderr
    key = args.key or os.environ.get("GATEWAY_ADMIN_KEY")
    if not key:
        print(
            "error: no API key: pass --key or set GATEWAY_ADMIN_KEY (a key with the admin scope: "
            "python -m gateway new-key --scopes admin)",
            file=err,
        )
        return 2
    if args.action == "shadow" and (args.off == (args.version is not None)):
        print("error: shadow needs a version or --off (not both)", file=err)
        return 2
    client = AdminClient(
        args.url or os.environ.get("GATEWAY_URL") or DEFAULT_URL, key, args.timeout
    )
    try:
        answer, text = _call(client, args)
    except AdminApiError as exc:
        print(f"error: {exc}", file=err)
        return 1
    except GatewayUnreachable as exc:
        print(f"error: {exc}", file=err)
        return 1
    print(json.dumps(answer, indent=2) if args.json else text, file=out)
    return 0


def _call(client: AdminClient, args: argparse.Namespace) -> tuple[Any, str]:
    """The action's API call: its JSON answer and the readable text of it."""
    action = args.action
    if action == "list":
        answer = client.get("/v1/admin/versions")
        return answer, format_versions(answer)
    if action in ("load", "unload"):
        path = f"/v1/admin/versions/{args.version}"
        answer = client.post(f"{path}/load") if action == "load" else client.delete(path)
        return answer, table(VERSION_HEADER, [version_row(answer)])
    if action == "policy":
        answer = client.get("/v1/admin/policy")
        return answer, format_policy(answer)
    if action == "canary":
        answer = client.post(
            "/v1/admin/policy/canary", {"version": args.version, "percent": args.percent}
        )
    elif action == "shadow":
        answer = client.post(
            "/v1/admin/policy/shadow",
            {"version": None if args.off else args.version, "percent": args.percent},
        )
    else:  # promote, rollback
        answer = client.post(f"/v1/admin/policy/{action}")
    return answer, format_change(answer)
