#!/usr/bin/env bash
# The image reference of a commit: ${KFLOOP_IMAGE_REGISTRY:-ghcr.io/<owner, lower case>}/kfloop:<commit>, and of its
# CUDA build (deploy/Dockerfile VARIANT=cuda) <commit>-cuda, the tag the launcher picks for GPU jobs
# (training/launch/cluster.py cuda_image).
# Usage: deploy/image-ref.sh OWNER COMMIT [cpu|cuda]   (KFLOOP_IMAGE_REGISTRY optional)
# Every job that needs the image computes it here from the same public values (the repository owner, the commit,
# a non-secret registry variable) instead of passing it as a job output: GitHub drops a job output that contains
# a secret's value (e.g. a registry path holding the registry user name), and the upload would then run the default
# image; `kfloop upload` refuses that in CI, this keeps it from happening.
set -euo pipefail
owner="$(tr '[:upper:]' '[:lower:]' <<<"${1:?owner}")"
commit="${2:?commit}"
case "${3:-cpu}" in
  cpu) suffix="" ;;
  cuda) suffix="-cuda" ;;
  *) echo "variant ${3}: use cpu or cuda" >&2; exit 2 ;;
esac
echo "${KFLOOP_IMAGE_REGISTRY:-ghcr.io/${owner}}/kfloop:${commit}${suffix}"
