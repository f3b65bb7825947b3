#!/usr/bin/env bash
# perf_analyzer against Triton alone, on a machine without a GPU: the tritonclient[all]==2.51.0 wheel
# ships the binary; it needs libb64.so.0d and libcudart.so.12, which nvidia-pytriton bundles under
# hashed names. Usage: [MODEL=text_regression_v2] load/perf_analyzer.sh 127.0.0.1:8001 [extra args]
set -euo pipefail
GRPC_URL=${1:?usage: $0 HOST:PORT [perf_analyzer args]}; shift
case "$GRPC_URL" in 127.0.0.1:*|localhost:*) ;; *) echo "only 127.0.0.1 targets" >&2; exit 2;; esac
PY=${PYTHON:-python}
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
BIN=$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/perf_analyzer
LIBS=$(mktemp -d); trap 'rm -rf "$LIBS"' EXIT
ln -s "$SITE"/nvidia_pytriton.libs/libb64-*.so.0d "$LIBS/libb64.so.0d"
ln -s "$SITE"/nvidia_pytriton.libs/libcudart-*.so.12* "$LIBS/libcudart.so.12"
"$PY" -m load.perf_input --out "$LIBS/texts.json" >/dev/null
LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BIN" \
  -m "${MODEL:-text_regression_v1}" -i grpc -u "$GRPC_URL" --input-data "$LIBS/texts.json" \
  --concurrency-range 1:16:15 --measurement-interval 5000 --percentile 99 "$@"
