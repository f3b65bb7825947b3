"""``python -m gateway models``: the CLI against the real app (over FakeTriton) on a real socket."""

from __future__ import annotations

import json
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn

from devtools.ports import free_port
from gateway import auth
from gateway.admin_cli import format_versions
from gateway.app import create_app
from gateway.auth import new_key
from gateway.cli import main
from gateway.settings import Settings
from tests.conftest import wait_for
from tests.unit.fake_triton import FakeTriton


@dataclass
class Served:
    """A gateway serving on 127.0.0.1, its fake Triton, and its keys."""

    url: str
    admin_key: str
    infer_key: str
    triton: FakeTriton

    def cli(self, *argv: str, key: str | None = None) -> int:
        """Run ``python -m gateway models <argv>`` against this gateway (admin key by default)."""
        return main(["models", "--url", self.url, f"--key={key or self.admin_key}", *argv])


def rows(out: str) -> dict[str, list[str]]:
    """The version table's rows by version (``v1``...), split into their cells' words."""
    return {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("v")}


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.fixture
def served() -> Iterator[Served]:
    """The app under uvicorn in a thread; pipeline versions 1 and 2 built, 1 loaded."""
    triton = FakeTriton(versions={1, 2}, loaded={1})
    admin_key, admin_entry = new_key(("admin",))
    infer_key, infer_entry = new_key(("infer",))
    port = free_port()
    settings = Settings(
        _env_file=None, port=port, api_keys=[infer_entry, admin_entry], health_interval_s=0.02
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, client=triton),
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        # Ready means the first policy exists (stable v1), which every admin call below needs.
        wait_for(lambda: _ready(url), timeout=30, what="the gateway's /readyz")
        yield Served(url, admin_key, infer_key, triton)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop"


def test_list_shows_versions_and_policy(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert served.cli("list") == 0
    out = capsys.readouterr().out
    assert rows(out)["v1"][:4] == ["v1", "ready", "stable", "0"]
    assert rows(out)["v2"][:4] == ["v2", "available", "-", "0"]
    assert out.splitlines()[0].split()[:4] == ["VERSION", "STATE", "ROLES", "IN"]
    assert "policy: stable v1 · canary none · shadow none · revision 1" in out


def test_load_then_canary_changes_the_policy_line(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("load", "2") == 0
    assert rows(capsys.readouterr().out)["v2"][:2] == ["v2", "ready"]
    assert 2 in served.triton.loaded

    assert served.cli("canary", "2", "--percent", "10") == 0
    out = capsys.readouterr().out
    assert "policy: stable v1 · canary v2 at 10 % · shadow none · revision 2" in out
    assert "reason: canary v2 at 10 %" in out

    assert served.cli("list") == 0
    assert rows(capsys.readouterr().out)["v2"][:3] == ["v2", "ready", "canary"]


def test_promote_makes_the_canary_stable(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("load", "2") == 0
    assert served.cli("canary", "2", "--percent", "10") == 0
    capsys.readouterr()
    assert served.cli("promote") == 0
    out = capsys.readouterr().out
    assert "policy: stable v2 · canary none · shadow none · revision 3" in out
    assert "reason: promoted v2 over v1" in out


def test_rollback_returns_to_the_previous_stable(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("load", "2") == 0
    assert served.cli("canary", "2", "--percent", "50") == 0
    assert served.cli("promote") == 0
    capsys.readouterr()
    assert served.cli("rollback") == 0
    out = capsys.readouterr().out
    assert "policy: stable v1 · canary none · shadow none · revision 4" in out
    assert "reason: rolled back v2 to v1" in out

    # Nothing left to roll back: the gateway's 409, as one error line.
    assert served.cli("rollback") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: 409 conflict: nothing to roll back")


def test_shadow_on_and_off(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert served.cli("load", "2") == 0
    assert served.cli("shadow", "2") == 0
    assert "shadow v2 · revision 2" in capsys.readouterr().out
    assert served.cli("shadow", "--off") == 0
    out = capsys.readouterr().out
    assert "shadow none · revision 3" in out
    assert "reason: shadow stopped" in out
    # Neither a version nor --off is a usage error, sent nowhere.
    assert served.cli("shadow") == 2
    assert "shadow needs a version or --off" in capsys.readouterr().err


def test_policy_shows_the_history_newest_first(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("load", "2") == 0
    assert served.cli("canary", "2", "--percent", "10") == 0
    capsys.readouterr()
    assert served.cli("policy") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "policy: stable v1 · canary v2 at 10 % · shadow none · revision 2"
    history = lines[lines.index("last 2 changes (newest first):") + 2 :]
    assert [line.split()[2] for line in history] == ["2", "1"]
    assert history[0].endswith("canary v2 at 10 %")
    assert " gateway " in history[1]


def test_unloading_a_routed_version_prints_the_409(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("unload", "1") == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == (
        "error: 409 conflict: pipeline version 1 serves traffic in the policy; roll back or "
        "promote another version first"
    )
    assert 1 in served.triton.loaded


def test_unload_of_an_unrouted_version(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert served.cli("load", "2") == 0
    capsys.readouterr()
    assert served.cli("unload", "2") == 0
    assert rows(capsys.readouterr().out)["v2"][:2] == ["v2", "available"]
    assert 2 not in served.triton.loaded


def test_a_key_without_the_admin_scope_gets_the_403(
    served: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    assert served.cli("list", key=served.infer_key) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: 403 forbidden: ")
    assert len(captured.err.strip().splitlines()) == 1


def test_json_output_parses(served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert served.cli("list", "--json") == 0
    answer = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in answer["versions"]] == [1, 2]
    assert answer["policy"]["stable"] == 1

    # The option before the action works the same.
    assert (
        main(["models", "--json", "--url", served.url, f"--key={served.admin_key}", "policy"]) == 0
    )
    policy = json.loads(capsys.readouterr().out)
    assert policy["policy"]["revision"] == 1
    assert len(policy["history"]) == 1


def test_url_and_key_from_the_environment(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_URL", served.url)
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", served.admin_key)
    assert main(["models", "list"]) == 0
    assert "policy: stable v1" in capsys.readouterr().out


def test_a_missing_key_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_ADMIN_KEY", raising=False)
    assert main(["models", "--url", "http://127.0.0.1:1", "list"]) == 2
    assert "pass --key or set GATEWAY_ADMIN_KEY" in capsys.readouterr().err


def test_an_unreachable_gateway_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # A port nothing listens on: the connection is refused at once.
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["models", "--url", url, "--key", "k", "list"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"error: cannot reach the gateway at {url}: ")
    assert len(captured.err.strip().splitlines()) == 1


def test_the_table_shows_the_build_manifest() -> None:
    manifest = {
        "built_at": "2026-11-30T09:00:00Z",
        "source_model": "sentence-transformers/all-MiniLM-L6-v2",
        "forest": {"trees": 100, "r2": 0.8123},
    }
    text = format_versions(
        {
            "policy": None,
            "versions": [
                {
                    "version": 3,
                    "state": "ready",
                    "roles": ["canary", "shadow"],
                    "in_flight": 4,
                    "reason": "",
                    "manifest": manifest,
                }
            ],
        }
    )
    header, row = text.splitlines()[:2]
    assert row.split() == [
        "v3",
        "ready",
        "canary,shadow",
        "4",
        "2026-11-30T09:00:00Z",
        "sentence-transformers/all-MiniLM-L6-v2",
        "0.812",
    ]
    # Columns line up: each value starts where its heading does.
    assert row.index("2026") == header.index("BUILT AT")
    assert row.index("0.812") == header.index("FOREST R^2")
    assert text.endswith("policy: no traffic policy yet")


def test_a_new_key_never_reads_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # A key starting with "-" broke `--key KEY` (argparse took it for an option): one in 64.
    draws = iter(["-starts-like-an-option", "fine-key"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda _: next(draws))
    key, entry = auth.new_key(("admin",))
    assert key == "fine-key" and entry.endswith(":admin")
