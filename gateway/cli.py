"""``python -m gateway``: serve, dev (embedded Triton + gateway), openapi, new-key, models."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gateway import admin_cli
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def serve(settings: Settings) -> int:
    """Run the gateway with uvicorn (uvloop and httptools when installed)."""
    import uvicorn

    from gateway.logs import configure_logging

    configure_logging(settings.log_level)
    uvicorn.run(
        "gateway.app:create_app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=None,
        access_log=False,
        loop="auto",
        http="auto",
    )
    return 0


def dev(settings: Settings, repository: Path, workdir: Path) -> int:
    """Embedded Triton (CPU profile) + gateway in one process tree; Ctrl-C stops both.

    Triton runs under a supervisor that restarts it on the same ports after a crash (with
    backoff); the gateway's readiness follows it down and back up by itself.
    """
    import uvicorn

    try:
        from build_models.profiles import render_repository
        from build_models.versions import ensemble_names, list_versions
        from devtools.supervisor import TritonSupervisor
        from devtools.triton import EmbeddedTriton
    except ImportError as exc:  # the gateway image ships the runtime package alone
        print(
            f"`dev` needs the development install (`make run` sets it up): {exc}", file=sys.stderr
        )
        return 2
    from gateway.app import create_app
    from gateway.auth import new_key
    from gateway.logs import configure_logging

    versions = list_versions(repository)
    if not versions:
        print(
            f"no built models in {repository}: run `make run` or `python -m build_models`",
            file=sys.stderr,
        )
        return 2
    configure_logging(settings.log_level)
    cpu_repository = render_repository(workdir / "cpu-model-repository", "cpu", repository)
    # Every built pipeline version is rendered under its own names (text_regression_vN, ...);
    # load all of their ensembles, so any version can be asked for without a reload.
    ensembles = [name for version in versions for name in ensemble_names(version)]
    server = EmbeddedTriton(cpu_repository, workdir / "triton", models=ensembles)
    print(f"starting Triton (CPU profile) from {cpu_repository} ...", file=sys.stderr)
    server.start()
    supervisor = TritonSupervisor(server).start()
    try:
        key, entry = new_key(("infer", "admin"))
        settings = settings.model_copy(
            update={
                "triton_grpc_url": server.grpc_url,
                "api_keys": [*settings.api_keys, entry],
                # The traffic policy outlives a restart of `make run` (as it does in compose).
                "policy_path": settings.policy_path or workdir / "traffic-policy.json",
            }
        )
        base = f"http://{settings.host}:{settings.port}"
        print(
            "\n".join(
                [
                    "",
                    f"  Triton      gRPC {server.grpc_url}  HTTP {server.http_url}  metrics {server.metrics_url}",
                    "              (restarted on these ports if it crashes)",
                    f"  Gateway     {base}  (docs: {base}/docs)",
                    f"  API key     {key}   (infer + admin; development only; valid until this process stops)",
                    f"  Models      GATEWAY_URL={base} GATEWAY_ADMIN_KEY={key} python -m gateway models list",
                    f"  Try         curl -H 'Authorization: Bearer {key}' -H 'content-type: application/json' "
                    f"""-d '{{"texts": ["Great blender, works perfectly."]}}' {base}/v1/predict""",
                    "",
                ]
            ),
            file=sys.stderr,
            flush=True,
        )
        uvicorn.run(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_config=None,
            access_log=False,
        )
    finally:
        # The supervisor first: a Triton stopped under a running supervisor would be restarted.
        supervisor.stop()
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="serve the gateway (settings from GATEWAY_* variables)")
    dev_parser = commands.add_parser("dev", help="embedded Triton with the CPU profile + gateway")
    dev_parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    dev_parser.add_argument("--workdir", type=Path, default=ROOT / ".work" / "dev")
    commands.add_parser("openapi", help="print the OpenAPI document")
    key_parser = commands.add_parser(
        "new-key", help="print a new API key and its configuration entry"
    )
    key_parser.add_argument(
        "--scopes", default="infer", help="'+'-separated scopes (default: infer)"
    )
    admin_cli.add_parser(commands)
    args = parser.parse_args(argv)

    if args.command == "models":
        # A client of a running gateway: it needs none of this process's GATEWAY_* settings.
        return admin_cli.run(args)

    if args.command == "new-key":
        from gateway.auth import new_key

        key, entry = new_key(tuple(args.scopes.split("+")))
        print(f"key:   {key}\nentry: {entry}   (GATEWAY_API_KEYS or the keys file)")
        return 0
    if args.command == "openapi":
        from gateway.app import create_app

        print(json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True))
        return 0
    settings = Settings()
    if args.command == "serve":
        return serve(settings)
    return dev(settings, args.repository.resolve(), args.workdir.resolve())
