"""The launcher of a KFP step pod whose pipeline root is an object store (run in the pod as ``python3 -c``).

kubeflow/pipelines 2.17 ``backend/src/v2/component/launcher_v2.go`` (``Execute``): ``downloadArtifacts`` copies each
input artifact from the object store to its local path, ``prepareOutputFolders`` makes the output artifacts'
folders, the command runs, then ``uploadOutputArtifacts`` copies each output artifact (a file, or a folder's files)
to its URI; the executor output and output parameter files, which the launcher keeps under its own folder
(``/kfp-launcher`` here), go to the object store too, where the test executor reads them back (KFP's launcher
reports them to MLMD). The local path of ``s3://b/k`` is ``/s3/b/k``, of ``minio://b/k`` ``/minio/b/k``
(kfp ``dsl/types/artifact_types.py`` ``Artifact._get_path``). The object store is the S3 API that
``AWS_ENDPOINT_URL`` names, with the pod's ``AWS_*`` credentials (s3fs).

A SIGTERM (the emissary, tests/cluster/argo_emissary.py, forwards a deleted pod's to the process group, the command
included) does not end this launcher before its command: KFP's Go launcher would exit at once, and the emissary
with it within its one-second reap poll (``osspecific.Wait``), cutting the command's own cleanup short; here the
command's cleanup (kfloop's launcher deleting its job) runs to its end, bounded by the kubelet's grace period, and
the launcher exits with the command's code (``128 + signal`` when a signal ended it), uploading nothing.

Arguments: a JSON object ``{"download": {local: uri}, "upload": {local: uri}}``, then the command.
"""
import json
import os
import signal
import subprocess
import sys

import s3fs


def key(uri: str) -> str:
    """The object store's ``bucket/key`` of an ``s3://`` or ``minio://`` URI."""
    return uri.split("://", 1)[1]


def main() -> int:
    plan, command = json.loads(sys.argv[1]), sys.argv[2:]
    store = s3fs.S3FileSystem()
    for local, uri in plan["download"].items():
        os.makedirs(os.path.dirname(local), exist_ok=True)
        store.get(key(uri), local, recursive=store.isdir(key(uri)))
    for local in plan["upload"]:
        os.makedirs(os.path.dirname(local), exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: None)  # a handler, not SIG_IGN: the command's exec resets it
    code = subprocess.call(command)
    if code:
        return code if code > 0 else 128 - code
    for local, uri in plan["upload"].items():
        if os.path.isdir(local):
            store.put(local.rstrip("/") + "/", key(uri), recursive=True)
        elif os.path.exists(local):
            store.put(local, key(uri))
    return 0


if __name__ == "__main__":
    sys.exit(main())
