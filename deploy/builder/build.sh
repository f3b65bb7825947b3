#!/usr/bin/env bash
# Entry point of the compose `builder` service: build the artifacts once for the Triton release,
# then render the repository that the `triton` service serves. Exits non-zero on any failure, so
# Triton (depends_on: service_completed_successfully) never starts on a half-built repository.
set -euo pipefail

: "${TRITON_RELEASE:?is set by the image (deploy/versions.env through docker-compose.yml)}"
profile="${TRITON_PROFILE:-gpu}"
committed=/src/model_repository # the checkout's model_repository, mounted read-only
source_repository=/models/source # committed configs + built artifacts, kept between runs
served_repository=/models/repository

# A wrong base image must fail here, in seconds, not later in Triton with an unreadable artifact.
python -m build_models.releases --check-installed "${TRITON_RELEASE}"

# Take only configs and model.py files from the checkout: artifacts built on the host were made
# by other torch/treelite versions. Artifacts already in the volume stay, and the builder skips
# the build when its inputs are unchanged.
mkdir -p "${source_repository}"
(
    cd "${committed}"
    find . \( -name config.pbtxt -o -name model.py -o -name .gitkeep \) -print0 |
        while IFS= read -r -d '' file; do
            install -D -m 0644 "${file}" "${source_repository}/${file}"
        done
)

python -m build_models --repository "${source_repository}" --triton-release "${TRITON_RELEASE}"

# TRITON_INSTANCES: space-separated MODEL=N (e.g. "bert=2 preprocess=2"), instances per device.
instance_args=()
for item in ${TRITON_INSTANCES:-}; do
    instance_args+=(--instances "${item}")
done
python -m build_models.profiles --profile "${profile}" --source "${source_repository}" \
    --out "${served_repository}" "${instance_args[@]}"
