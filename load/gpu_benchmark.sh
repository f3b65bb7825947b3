#!/usr/bin/env bash
# Full GPU pipeline benchmark at batch 512, comparable with the reference figures (A100: 31 ms
# latency and 8308 samples/s at batch 512). Needs: an NVIDIA GPU, Docker with the NVIDIA runtime,
# GPU artifacts built into ./model_repository (TorchScript exported with PyTorch 2.5, Treelite 4.3
# checkpoint; see docs/load-testing.md). Finishes in about 3-5 minutes (hard cap 9 minutes).
# A GPU host without Docker: tests/gpu/device_check.sh (docs/benchmarks.md).
#   load/gpu_benchmark.sh [model_repository] [results_dir]
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(realpath "${1:-model_repository}")
OUT=$(realpath -m "${2:-load/results/gpu-$(date +%Y%m%d-%H%M%S)}")
# Artifacts built by another PyTorch than the release's libtorch (e.g. `make run`'s CPU build)
# may not load in Triton's PyTorch backend: refuse them before pulling any image.
python -m build_models.releases --check-manifest "$REPO"
# Versions come from the one place the compose stack reads them from.
# shellcheck source=deploy/versions.env
set -a; . deploy/versions.env; set +a
# The plain NGC image lacks what preprocess imports (tokenizers, cupy): build the stack's image.
if [ -z "${SERVER_IMAGE:-}" ]; then
  SERVER_IMAGE=textscore-triton:bench
  docker build -q -t "$SERVER_IMAGE" --build-arg TRITON_RELEASE="$TRITON_RELEASE" \
    --build-arg TOKENIZERS_VERSION="$TOKENIZERS_VERSION" --build-arg CUPY_VERSION="$CUPY_VERSION" \
    deploy/triton >/dev/null
fi
SDK_IMAGE=${SDK_IMAGE:-nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3-sdk}
BATCH=${BATCH:-512}
NAME=textscore-gpu-bench-$$
mkdir -p "$OUT"
python -m build_models.profiles --profile gpu --source "$REPO" --out "$OUT/repository" >/dev/null
python -m load.perf_input --out "$OUT/texts.json" --count 4096 >/dev/null
cleanup() { docker rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
# Artifacts are symlinked into the rendered repository: mount their source at the same path.
docker run -d --rm --name "$NAME" --gpus all --shm-size 1g --network host \
  -v "$OUT/repository:$OUT/repository:ro" -v "$REPO:$REPO:ro" "$SERVER_IMAGE" \
  tritonserver --model-repository="$OUT/repository" --model-control-mode=explicit \
  --load-model=text_regression_v1 --http-address=127.0.0.1 --grpc-address=127.0.0.1 \
  --metrics-address=127.0.0.1 >/dev/null
for _ in $(seq 180); do
  curl -fs http://127.0.0.1:8000/v2/health/ready >/dev/null && break
  docker inspect "$NAME" >/dev/null 2>&1 || { echo "tritonserver exited" >&2; exit 1; }
  sleep 1
done
curl -fs http://127.0.0.1:8000/v2/health/ready >/dev/null || { docker logs "$NAME" | tail -40; exit 1; }
# Batch 512 per request, 1..4 requests in flight: latency (p50/p99) and samples/s per level.
timeout 540 docker run --rm --network host -v "$OUT:$OUT" "$SDK_IMAGE" \
  perf_analyzer -m text_regression_v1 -i grpc -u 127.0.0.1:8001 -b "$BATCH" \
  --input-data "$OUT/texts.json" --concurrency-range 1:4 --measurement-interval 10000 \
  --percentile 99 -f "$OUT/perf_analyzer.csv" | tee "$OUT/perf_analyzer.txt"
docker exec "$NAME" nvidia-smi --query-gpu=name,memory.used --format=csv >"$OUT/gpu.txt" || true
echo "results in $OUT (compare 'Throughput' with 8308 infer/sec and p50/p99 latency with 31 ms)"
