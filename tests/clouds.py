"""One view of the three object stores the storage suite runs against: S3 (SeaweedFS), GCS
(fake-gcs-server) and Azure Blob (Azurite); tests/conftest.py's `cloud` fixture gives each in turn."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dataio.storage.options import StorageOptions
from dataio.storage.store import Store

SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}


class Cloud:
    """A store kind with its session server: URLs, options (direct or through a proxy), CLI flags."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind, self.server = kind, server
        self.scheme = SCHEMES[kind]

    def __repr__(self) -> str:
        return f"Cloud({self.kind})"

    @property
    def endpoint_url(self) -> str:
        return str(self.server.endpoint_url)

    def new_url(self, prefix: str = "p") -> str:
        """A fresh bucket (container) and `prefix` in it, as a URL of this scheme."""
        return f"{self.scheme}://{self.server.new_bucket()}/{prefix}"

    def options(self, endpoint_url: str | None = None) -> StorageOptions:
        """Options that reach the server, or the same server at `endpoint_url` (a fault proxy in front)."""
        options = self.server.options()
        if endpoint_url is None:
            return options
        if self.kind == "s3":
            return replace(options, endpoint_url=endpoint_url)
        if self.kind == "gcs":
            return replace(options, gcs_endpoint_url=endpoint_url)
        conn = str(options.azure_connection_string).replace(self.endpoint_url, endpoint_url)
        return replace(options, azure_connection_string=conn)

    def store(self, url: str, endpoint_url: str | None = None, **kwargs: Any) -> Store:
        return Store(url, self.options(endpoint_url), **kwargs)

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.options().secrets

    def config_toml(self, endpoint_url: str | None = None) -> str:
        """A storage config file's text that reaches the server (through `endpoint_url` if given)."""
        options = self.options(endpoint_url)
        if self.kind == "s3":
            return (f'[s3]\nendpoint_url = "{options.endpoint_url}"\nkey = "{options.key}"\n'
                    f'secret = "{options.secret}"\nregion = "us-east-1"\n')
        if self.kind == "gcs":
            return f'[gcs]\nendpoint_url = "{options.gcs_endpoint_url}"\ntoken = "anon"\nproject = "shardify-test"\n'
        return f'[azure]\nconnection_string = "{options.azure_connection_string}"\n'
