"""The storage initializer's entrypoint as the test cluster's process kubelet runs it (the image
``kserve/storage-initializer``'s ``/storage-initializer/scripts/initializer-entrypoint`` needs the ``kserve_storage``
package, which the test environment does not install): ``src_uri dest_path`` pairs, each ``s3://`` folder downloaded
as kserve v0.20.0's ``python/storage/kserve_storage/kserve_storage.py`` ``Storage._download_s3`` does it.

Followed from there: boto3 with the environment the credential builder gives the init container
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``); ``head_bucket``
first; every object under the prefix but "folders" and empty objects, at its key less the prefix (an exact object:
its base name); none found is ``RuntimeError("Failed to fetch model. No model found in <uri>.")``; the entrypoint's
usage message and exit 1 on any error (``initializer-entrypoint``). Only ``s3://`` is played (the controller mounts
``pvc://`` sources directly and refuses the other schemes before a pod exists)."""
from __future__ import annotations

import os
import sys
from urllib.parse import urlparse

import boto3


def download_s3(uri: str, dest: str) -> int:
    """Download the objects under ``uri`` into ``dest``; how many."""
    parsed = urlparse(uri, scheme="s3")
    bucket_name, bucket_path = parsed.netloc, parsed.path.lstrip("/")
    s3 = boto3.resource("s3")
    s3.meta.client.head_bucket(Bucket=bucket_name)
    count = 0
    for obj in s3.Bucket(bucket_name).objects.filter(Prefix=bucket_path):
        if obj.key.endswith("/") or obj.size == 0:
            continue
        exact = bucket_path == obj.key
        target = os.path.join(dest, obj.key.rsplit("/", 1)[-1] if exact else
                              obj.key.removeprefix(bucket_path).lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        s3.Bucket(bucket_name).download_file(obj.key, target)
        count += 1
        if exact:
            break
    if count == 0:
        raise RuntimeError(f"Failed to fetch model. No model found in {uri}.")
    return count


def main(argv: list[str]) -> int:
    if len(argv) < 2 or len(argv) % 2:
        print("Usage: initializer-entrypoint src_uri_0 dest_path_0 ... src_uri_n dest_path_n")
        return 1
    for uri, dest in zip(argv[::2], argv[1::2]):
        os.makedirs(dest, exist_ok=True)
        try:
            print(f"Copied {download_s3(uri, dest)} objects from {uri} to {dest}", flush=True)
        except Exception as exc:  # the entrypoint's own catch-all: logged, exit 1
            print(f"Storage initialization failed: {exc}", flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
