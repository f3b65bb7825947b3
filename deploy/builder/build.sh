#!/usr/bin/env bash
# Entry point of the compose `builder` service: build a pipeline version for the Triton release,
# then add it to the repository that the `triton` service serves. Exits non-zero on any failure, so
# Triton (depends_on: service_completed_successfully) never starts on a half-built repository.
#
# Re-runnable while the stack runs: `docker compose run --rm builder [build_models options]`
# (e.g. `--trees 100`) builds the next pipeline version N (nothing when a version with exactly
# these inputs exists) and renders it *additively*: text_regression_vN, text_embedding_vN and any
# new part models appear next to the served ones, each renamed into place whole; models already
# served are never touched. Triton (explicit model control) loads the new version when asked to.
set -euo pipefail

: "${TRITON_RELEASE:?is set by the image (deploy/versions.env through docker-compose.yml)}"
profile="${TRITON_PROFILE:-gpu}"
committed=/src/model_repository # the checkout's model_repository, mounted read-only
source_repository=/models/source # committed configs + built versions, kept between runs
served_repository=/models/repository

# A wrong base image must fail here, in seconds, not later in Triton with an unreadable artifact.
python -m build_models.releases --check-installed "${TRITON_RELEASE}"

# Take only the committed templates from the checkout (configs, .gitkeep, preprocess/1/model.py):
# artifacts built on the host were made by other torch/treelite versions, and a host build's
# preprocess/<N>/model.py copy must never overwrite the volume's (a built version is immutable).
# Versions already in the volume stay; the builder shares every part whose inputs are unchanged.
mkdir -p "${source_repository}"
(
    cd "${committed}"
    {
        find . -mindepth 2 -maxdepth 2 -name config.pbtxt -print0
        find . -mindepth 3 -maxdepth 3 -name .gitkeep -print0
        printf '%s\0' ./preprocess/1/model.py
    } | while IFS= read -r -d '' file; do
        install -D -m 0644 "${file}" "${source_repository}/${file}"
    done
)

python -m build_models --repository "${source_repository}" --triton-release "${TRITON_RELEASE}" "$@"

# TRITON_INSTANCES: space-separated MODEL=N (e.g. "bert=2 preprocess=2"), instances per device.
instance_args=()
for item in ${TRITON_INSTANCES:-}; do
    instance_args+=(--instances "${item}")
done
python -m build_models.profiles --profile "${profile}" --source "${source_repository}" \
    --out "${served_repository}" --add "${instance_args[@]}"
python -m build_models --repository "${source_repository}" --list
