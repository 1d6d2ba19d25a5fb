#!/usr/bin/env bash
# The commit an image built from this working tree is of: HEAD's SHA, with `-dirty` when the tree differs from it
# (a changed tracked file, or an untracked file that is not ignored: the image's build context takes both).
# deploy/e2e.sh and deploy/kind-e2e.sh tag the image and set its GIT_COMMIT label (and KFLOOP_GIT_COMMIT, which the
# lineage records) from it; `kfloop upload` refuses an image tagged `-dirty` unless `--image` names it.
#   deploy/image-commit.sh [DIR]    prints e.g. 3f2a9c0d1e4b...-dirty; `unknown` outside a git checkout
set -euo pipefail
dir=${1:-.}
sha=$(git -C "$dir" rev-parse HEAD 2>/dev/null) || { echo unknown; exit 0; }
if [ -n "$(git -C "$dir" status --porcelain --untracked-files=normal)" ]; then
  echo "$sha-dirty"
else
  echo "$sha"
fi
