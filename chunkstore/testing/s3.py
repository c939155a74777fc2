"""What the tests' S3 servers (moto_s3.py, radosgw.py) share: how a test, a `chunkstore serve`
process or a store reaches one. A server sets ``endpoint_url``, ``region``, ``access_key_id`` and
``secret_access_key`` and its own ``client()`` (a boto3 client for set-up and inspection)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chunkstore.disk.objects import ObjectStoreConfig


class S3Endpoint:
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key: str

    def client(self):  # pragma: no cover - each server has its own
        raise NotImplementedError

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def aws_env(self) -> dict[str, str]:
        """The AWS variables a `chunkstore serve` process reaches this server with."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_REGION": self.region,
                "AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    @contextmanager
    def in_environment(self) -> Iterator[None]:
        """This process's AWS variables name this server for the block (what a store opened from
        the environment reaches), and are as they were after it."""
        saved = {k: os.environ.get(k) for k in self.aws_env()}
        os.environ.update(self.aws_env())
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def config(self, url: str, **overrides) -> ObjectStoreConfig:
        """An ObjectStoreConfig for ``url`` (s3://bucket/prefix) on this server."""
        from chunkstore.disk.objects import ObjectStoreConfig

        return ObjectStoreConfig(url, endpoint_url=self.endpoint_url, region=self.region,
                                 access_key_id=self.access_key_id, secret_access_key=self.secret_access_key,
                                 **overrides)
