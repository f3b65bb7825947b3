#!/usr/bin/env bash
# GPU checks of the shared-memory transport (issue 4), under 10 minutes on one GPU machine with the
# project installed (make install): the cuda_shm tests (CUDA IPC regions, results equal to gRPC,
# cleanup) against the embedded Triton, then the system-shm tests as a control. Needs: an NVIDIA GPU
# and CuPy of its CUDA (`pip install -e '.[cuda]'` for CUDA 12, '.[cuda13]' for CUDA 13).
# A bare GPU host without the project's environment: tests/gpu/device_check.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python}"
nvidia-smi -L
# The import the gateway really does, with warnings as errors as in the test suite: it must pass.
"$PYTHON" -W error -c "from gateway.triton.shm import load_cupy; load_cupy()" ||
  { echo "CUDA shared memory cannot start here (see the reason above)" >&2; exit 2; }
timeout 420 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_shm.py -rs
timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_shm.py -k "equal or too_large"
