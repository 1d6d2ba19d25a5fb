"""The storage initializer's entrypoint as the test cluster's process kubelet runs it (the image
``kserve/storage-initializer``'s ``/storage-initializer/scripts/initializer-entrypoint`` needs the ``kserve_storage``
package, which the test environment does not install): ``src_uri dest_path`` pairs, each ``s3://`` folder downloaded
as kserve v0.20.0's ``python/storage/kserve_storage/kserve_storage.py`` ``Storage._download_s3`` does it.

Followed from there: the S3 client with the environment the credential builder gives the init container
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``); ``head_bucket``
first; every object under the prefix but "folders" and empty objects, at its key less the prefix (an exact object:
its base name); none found is ``RuntimeError("Failed to fetch model. No model found in <uri>.")``; the entrypoint's
usage message and exit 1 on any error (``initializer-entrypoint``). Only ``s3://`` is played (the controller mounts
``pvc://`` sources directly and refuses the other schemes before a pod exists).

kserve_storage calls boto3's resource API (``Bucket.objects.filter``, ``download_file``); this script makes the same
requests with botocore, which boto3 runs on (ListObjectsV2 pages, GetObject), so that it also runs in the kfloop
image (which has botocore, not boto3): the Docker kubelet runs it there as the image
``kserve/storage-initializer:v0.20.0`` (tests/cluster/kserve_operator.py :func:`~cluster.kserve_operator.
build_storage_initializer`), whose entrypoint it is, as in kserve's ``python/storage-initializer.Dockerfile``."""
from __future__ import annotations

import os
import sys
from urllib.parse import urlparse

import botocore.session


def download_s3(uri: str, dest: str) -> int:
    """Download the objects under ``uri`` into ``dest``; how many."""
    parsed = urlparse(uri, scheme="s3")
    bucket_name, bucket_path = parsed.netloc, parsed.path.lstrip("/")
    s3 = botocore.session.get_session().create_client("s3")  # AWS_ENDPOINT_URL and the keys from the environment
    s3.head_bucket(Bucket=bucket_name)
    count = 0
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket_name, Prefix=bucket_path)
    for obj in (o for page in pages for o in page.get("Contents", [])):
        key = obj["Key"]
        if key.endswith("/") or obj["Size"] == 0:
            continue
        exact = bucket_path == key
        target = os.path.join(dest, key.rsplit("/", 1)[-1] if exact else key.removeprefix(bucket_path).lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        body = s3.get_object(Bucket=bucket_name, Key=key)["Body"]
        with open(target, "wb") as out:
            for chunk in iter(lambda: body.read(1 << 20), b""):
                out.write(chunk)
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
