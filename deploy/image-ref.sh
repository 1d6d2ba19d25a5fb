#!/usr/bin/env bash
# The image reference of a commit: ${KFLOOP_IMAGE_REGISTRY:-ghcr.io/<owner, lower case>}/kfloop:<commit>.
# Usage: deploy/image-ref.sh OWNER COMMIT   (KFLOOP_IMAGE_REGISTRY optional)
# Every job that needs the image computes it here from the same public values (the repository owner, the commit,
# a non-secret registry variable) instead of passing it as a job output: GitHub drops a job output that contains
# a secret's value (e.g. a registry path holding the registry user name), and the upload would then run the default
# image; `kfloop upload` refuses that in CI, this keeps it from happening.
set -euo pipefail
owner="$(tr '[:upper:]' '[:lower:]' <<<"${1:?owner}")"
commit="${2:?commit}"
echo "${KFLOOP_IMAGE_REGISTRY:-ghcr.io/${owner}}/kfloop:${commit}"
