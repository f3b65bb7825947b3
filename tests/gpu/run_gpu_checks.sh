#!/usr/bin/env bash
# GPU checks of the shared-memory transport (issue 4), under 10 minutes on one GPU machine:
# the cuda_shm tests (CUDA IPC regions, results equal to gRPC, cleanup) against the embedded
# Triton, then the system-shm tests as a control. Needs: NVIDIA GPU, `pip install
# 'tritonclient[cuda]==2.51.0'` (cuda-python) and setuptools<81 (tritonclient imports pkg_resources).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
nvidia-smi -L
"$PYTHON" -c "import cuda" || { echo "cuda-python is missing" >&2; exit 2; }
timeout 420 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_shm.py -rs
timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_shm.py -k "equal or too_large"
