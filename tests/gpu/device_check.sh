#!/usr/bin/env bash
# The GPU check for a bare CUDA host: no Docker, no network, no project environment. What the host
# lacks comes in the bundle (`python -m load.gpu.bundle build --out .bundle` on a machine with
# network; it and the working tree fit the 64 MiB a device run carries). Runs in under 8 minutes
# and writes device-check.json (load/gpu/check.py says what each phase measures). Without a GPU,
# or with --dry-run, every GPU phase is skipped with its reason and the JSON keeps its shape.
#   tests/gpu/device_check.sh [--dry-run | --rehearse] [--bundle DIR] [--out DIR]
#                             [--budget-s SECONDS] [--shapes minilm,bert-large]
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3}"
BUNDLE=.bundle
RESULTS="${OUT:-.work/device-check}"
UNPACKED="${TMPDIR:-/tmp}/textscore-gpu-bundle"
LOCAL=""  # set: run in this environment, without the bundle (dry run, CPU rehearsal)
BUDGET=430
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run | --rehearse) LOCAL=1; ARGS+=("$1") ;;
    --bundle) BUNDLE="$2"; shift ;;
    --out) RESULTS="$2"; shift ;;
    --budget-s) BUDGET="$2"; shift ;;
    --shapes) ARGS+=("$1" "$2"); shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
export PYTHONUNBUFFERED=1
if [ -z "$LOCAL" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  # The driver finds and records the reason itself, and runs dry.
  echo "no NVIDIA GPU answers nvidia-smi -L here: a dry run, without the bundle" >&2
  LOCAL=1
fi
# The bundle's packages go ahead of the host's; numpy<2 (stub-site) only to Triton's stubs.
if [ -z "$LOCAL" ] && [ -f "$BUNDLE/manifest.json" ]; then
  "$PYTHON" -m load.gpu.bundle install --bundle "$BUNDLE" --into "$UNPACKED"
  export PYTHONPATH="$UNPACKED/site${PYTHONPATH:+:$PYTHONPATH}"
  ARGS+=(--bundle "$BUNDLE" --stub-site "$UNPACKED/stub-site" --minilm "$UNPACKED/minilm")
fi
# The driver keeps the budget itself and writes the JSON after every phase; this limit only stops
# a hang (SIGTERM 30 s past the budget: the driver stops its servers and frees its regions;
# SIGKILL 15 s later).
timeout -k 15 $((BUDGET + 30)) "$PYTHON" -m load.gpu.check --out "$RESULTS" --budget-s "$BUDGET" "${ARGS[@]}"
