"""A real S3 API server for tests: moto's ``moto_server`` process on a free loopback port.

It runs in its own process group and is stopped as a group. s3fs, boto3 and pyarrow reach it with
``AWS_ENDPOINT_URL`` and the dummy key pair below (:meth:`S3Server.env`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cluster.server_process import free_port, start_server, stop_group

START_TIMEOUT_S = 60
ACCESS_KEY_ID = "AKIAKFLOOPTESTKEY0001"
SECRET_ACCESS_KEY = "kfloop-test-secret-never-printed"
"""Dummy credentials; tests assert that neither appears in output, lineage or MLflow params."""


@dataclass(kw_only=True)
class S3Server:
    """A running ``moto_server``; with ``authenticate`` it checks signatures and knows no key pair at all."""

    root: Path
    authenticate: bool = False
    url: str = ""
    process: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        """The standard AWS environment that points every S3 client (s3fs, boto3, pyarrow, MLflow) here; the
        instance-metadata lookup is off, so a client without keys fails at once instead of asking 169.254.169.254."""
        return {"AWS_ENDPOINT_URL": self.url, "MLFLOW_S3_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> "S3Server":
        """Start the server and wait until it answers.

        Raises:
            RuntimeError: it did not answer within START_TIMEOUT_S (its log is in the message).
        """
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if self.authenticate else {})}
        self.process = start_server(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            health_url=f"{self.url}/moto-api/", log_path=self.root / f"moto-{port}.log", env=env,
            timeout_s=START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        """Stop the server's process group."""
        stop_group(self.process)
