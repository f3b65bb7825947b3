#!/usr/bin/env bash
# Headless Chromium renders /docs (Swagger UI) and /redoc (ReDoc) with no network. The gateway
# runs on a free loopback port with no Triton behind it (it stays not-ready; the docs do not care),
# every host name but 127.0.0.1 is unresolvable, and the rendered DOM must list the operations.
# Chromium's net log must show that every request the pages made went to the gateway.
# The DOMs, screenshots, net logs and logs stay in OUT: the first argument, else a new temporary
# folder. Exits 0 with "skipped: no chromium" when Chromium is not installed.
# Usage: tests/browser/check_docs_offline.sh [OUT]   (PYTHON and CHROMIUM name the programs)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
CHROMIUM="${CHROMIUM:-chromium}"
if ! command -v "$CHROMIUM" >/dev/null 2>&1; then
    echo "skipped: no chromium"
    exit 0
fi
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
profiles="$(mktemp -d)"
gateway_pid=""

cleanup() {
    if [[ -n "$gateway_pid" ]]; then
        kill "$gateway_pid" 2>/dev/null || true
        wait "$gateway_pid" 2>/dev/null || true
    fi
    rm -rf "$profiles"
}
trap cleanup EXIT

read -r port triton_port < <("$PYTHON" -c \
    'from devtools.ports import free_ports; print(*free_ports(2))')
base="http://127.0.0.1:$port"
# Nothing listens on Triton's port: the lifespan's connection fails and the gateway serves on.
GATEWAY_HOST=127.0.0.1 GATEWAY_PORT="$port" GATEWAY_TRITON_GRPC_URL="127.0.0.1:$triton_port" \
    "$PYTHON" -m gateway serve >"$out/gateway.log" 2>&1 &
gateway_pid=$!

if ! "$PYTHON" - "$base" <<'EOF'
import sys
import time
import urllib.request

# No proxy: the gateway is on loopback whatever the environment says.
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
deadline = time.monotonic() + 30
while True:
    try:
        opener.open(sys.argv[1] + "/livez", timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("the gateway did not answer /livez within 30 s")
        time.sleep(0.2)
EOF
then
    cat "$out/gateway.log" >&2
    exit 1
fi

chromium_flags=(
    --headless --no-sandbox --disable-gpu --no-first-run
    --disable-background-networking --disable-component-update --disable-sync
    --no-proxy-server
    # The air gap: no name resolves but the gateway's address.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
    # Page scripts run up to 15 s of virtual time (rendering takes ~1 s) before the DOM is read.
    --virtual-time-budget=15000
    "--window-size=1280,1400" --hide-scrollbars
)

# browse PAGE ARGS...: load $base/PAGE in a fresh profile, the console going to PAGE.chromium.log.
browse() {
    local page=$1
    shift
    timeout 120 "$CHROMIUM" "${chromium_flags[@]}" \
        --user-data-dir="$(mktemp -d "$profiles/profile.XXXXXX")" \
        --enable-logging=stderr --v=0 "$@" "$base/$page" 2>>"$out/$page.chromium.log"
}

# expect PAGE PATTERN WHAT: PAGE's rendered DOM must match PATTERN.
expect() {
    if ! grep -Eq "$2" "$out/$1.html"; then
        echo "FAIL: /$1 rendered no $3 (looked for $2 in $out/$1.html)" >&2
        exit 1
    fi
}

for page in docs redoc; do
    browse "$page" --log-net-log="$out/$page.netlog.json" --dump-dom >"$out/$page.html"
    browse "$page" --screenshot="$out/$page.png"
done

expect docs 'class="opblock opblock-post' "Swagger UI operation blocks"
expect docs 'id="operations-[a-z]+-predict"' "predict operation"
expect docs 'id="operations-[a-z]+-embed"' "embed operation"
expect redoc 'id="operation/predict"' "predict operation"
expect redoc 'id="operation/embed"' "embed operation"
if grep -q "Something went wrong" "$out/redoc.html"; then
    echo "FAIL: ReDoc shows an error (see $out/redoc.html)" >&2
    exit 1
fi
operations=$(grep -o 'class="opblock opblock-[a-z]*' "$out/docs.html" | wc -l)

# The requests the pages made: the page itself, and those its HTML and scripts started (initiated by
# the gateway's origin). Chromium's own background requests (update checks, autofill) are not the
# pages' and are left out. Each must have gone to the gateway.
"$PYTHON" - "$base" "$out" <<'EOF'
import json
import sys
from pathlib import Path

base, out = sys.argv[1], Path(sys.argv[2])
expected = {
    "docs": ["/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/openapi.json"],
    "redoc": ["/docs/static/redoc.standalone.js", "/openapi.json"],
}
for page, needed in expected.items():
    log = json.loads((out / f"{page}.netlog.json").read_text())
    names = {number: name for name, number in log["constants"]["logEventTypes"].items()}
    urls = []
    for event in log["events"]:
        params = event.get("params", {})
        if names.get(event["type"]) != "URL_REQUEST_START_JOB":
            continue
        by_page = params.get("initiator", "").startswith("http://127.0.0.1")
        if by_page or params.get("request_type") == "main frame":
            urls.append(params["url"])
    elsewhere = [url for url in urls if not url.startswith(base + "/")]
    missing = [path for path in needed if base + path not in urls]
    if elsewhere or missing:
        sys.exit(f"FAIL: /{page} requested {elsewhere} elsewhere; never requested {missing}")
    print(f"/{page}: {len(urls)} requests, all to {base}")
EOF

echo "ok: Swagger UI rendered $operations operations and ReDoc rendered predict and embed" \
    "with no network; DOMs and screenshots in $out"
