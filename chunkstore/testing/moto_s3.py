"""A fast S3 stand-in for unit tests: moto's server in a child process on 127.0.0.1.

The end-to-end tests of the shared tier run on Ceph's RADOS Gateway (``testing/radosgw.py``); this
one starts in about a second and serves the object store's contract tests. Invariants: it listens
on 127.0.0.1 only, it is stopped by the PID it was started with (SIGTERM, then SIGKILL), and it keeps
everything in its process's memory (a restart is empty).

    with MotoS3Server() as s3:
        s3.create_bucket("chunks")
        ObjectPayloads(s3.config("s3://chunks/prefix"))
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from chunkstore.testing.postgres import HOST, free_port
from chunkstore.testing.s3 import S3Endpoint
from chunkstore.testing.throwaway import Throwaway, end_process

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
# moto accepts any credentials; these only have to be given (no AWS variables are read then).
ACCESS_KEY_ID = "chunkstore-test"
SECRET_ACCESS_KEY = "chunkstore-test-secret"
REGION = "us-east-1"


class MotoS3Error(RuntimeError):
    """The stand-in could not be started."""


class MotoS3Server(Throwaway, S3Endpoint):
    """moto's S3 on 127.0.0.1:``port`` (a free one by default), output in ``log_path`` if given."""

    def __init__(self, *, port: int | None = None, log_path: Path | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.port = port if port is not None else free_port()
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.endpoint_url = f"http://{HOST}:{self.port}"
        self.access_key_id, self.secret_access_key, self.region = ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()
        self.pid = self._process.pid
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise MotoS3Error(f"moto's server exited with {self._process.returncode} (log: {self.log_path})")
            try:
                urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1).close()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        self.stop()
        raise MotoS3Error(f"moto's server did not answer on {self.endpoint_url} within {self.start_timeout_s} s")

    def stop(self) -> None:
        if self._process is not None:
            end_process(self._process, signal.SIGTERM, STOP_TIMEOUT_S)

    def client(self):
        """A boto3 S3 client for set-up and inspection (buckets, raw objects)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key)

