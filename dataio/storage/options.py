"""StorageOptions: the endpoint, credentials and policies a Store is opened with.

Credentials come from flags, a config file or the standard AWS variables (in that order); they
are kept out of reprs and never appear in a message (see dataio.storage.redact).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dataio.storage import cloud_options
from dataio.storage.hedge import HedgePolicy
from dataio.storage.redact import connection_string_secrets, url_secrets
from dataio.storage.retry import RetryPolicy


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageOptions:
    """Where an object store is and who we are there; key and secret never print."""

    endpoint_url: str | None = None
    key: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    region: str | None = None
    anon: bool = False
    # Google Cloud Storage (gs://): an endpoint (fake-gcs-server; None: Google's), a token (a service-account
    # JSON path, "anon", "google_default", ...; as gcsfs takes it) and the project.
    gcs_endpoint_url: str | None = None
    gcs_token: str | None = field(default=None, repr=False)
    gcs_project: str | None = None
    # gs:// objects of at least this many bytes go up as resumable uploads of shardify's own, whose
    # sessions a write records and `shardify gc` cancels (dataio/storage/gcs_resumable.py).
    gcs_resumable_bytes: int = 50 << 20
    # Azure Blob (az://, abfs://): an account with its key or a SAS token, or a connection string.
    azure_account_name: str | None = None
    azure_account_key: str | None = field(default=None, repr=False)
    azure_connection_string: str | None = field(default=None, repr=False)
    azure_sas_token: str | None = field(default=None, repr=False)
    # With one botocore attempt per try and RetryPolicy.deadline_s over the tries, an endpoint
    # that accepts connections but never answers fails a first request (FIRST_REQUEST_DEADLINE_S)
    # after two read timeouts; a healthy store rarely goes 10 s without sending a byte, and
    # when a loaded one does, the retry gets a second chance.
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    # Reads of remote stores slower than k x their recent median get a second request
    # (dataio.storage.hedge); None: never.
    hedge: HedgePolicy | None = HedgePolicy()
    # S3 reads into a caller's buffer (Store.read_into: RAW windows) come as parts of about part_bytes,
    # up to parts_in_flight at once, each body received in place (dataio/storage/s3_into.py).
    part_bytes: int = 16 << 20
    parts_in_flight: int = 8
    # Both above as caps: parts sized from the throughput measured per endpoint, and counted over all of
    # the process's reads of it, from 2 (fewer after errors or stalls, more while each extra request adds
    # throughput; dataio/storage/tune.py). Off: parts_in_flight per read, fixed.
    adapt_parts: bool = True
    # How each call retries transient errors: backoff until its time budget (deadline_s, 2 minutes)
    # is spent; a Store given its own RetryPolicy uses that one instead.
    retry: RetryPolicy = RetryPolicy()

    def __post_init__(self) -> None:
        if (self.key is None) != (self.secret is None):
            raise ValueError("give both an access key and a secret key, or neither")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("storage timeouts must be positive")
        if isinstance(self.gcs_resumable_bytes, bool) or not isinstance(self.gcs_resumable_bytes, int) \
                or self.gcs_resumable_bytes < 1:
            raise ValueError(f"gcs_resumable_bytes must be a whole number of bytes >= 1, "
                             f"got {self.gcs_resumable_bytes!r}")
        for name in ("part_bytes", "parts_in_flight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        if not isinstance(self.adapt_parts, bool):
            raise TypeError(f"adapt_parts must be True or False, got {self.adapt_parts!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every credential these options hold, and the parts of a connection string or SAS token
        that are secret on their own (a key, a signature), for redact()."""
        found = [self.key, self.secret, self.gcs_token, self.azure_account_key, self.azure_sas_token,
                 self.azure_connection_string]
        found += connection_string_secrets(self.azure_connection_string or "")
        found += url_secrets("?" + (self.azure_sas_token or "").lstrip("?"))
        return tuple(dict.fromkeys(s for s in found if s))

    def fsspec_kwargs(self, protocol: str) -> dict[str, Any]:
        """Keyword arguments for fsspec's filesystem of `protocol` (S3, GCS and Azure take some)."""
        if protocol not in ("s3", "s3a"):
            return cloud_options.fsspec_kwargs(self, protocol)
        client_kwargs: dict[str, Any] = {}
        if self.endpoint_url:
            client_kwargs["endpoint_url"] = self.endpoint_url
        if self.region:
            client_kwargs["region_name"] = self.region
        kwargs: dict[str, Any] = {
            "client_kwargs": client_kwargs,
            # Timeouts belong to botocore's Config: s3fs passes unknown top-level keywords on
            # to aiobotocore's session, which refuses them.
            "config_kwargs": {
                "connect_timeout": self.connect_timeout_s,
                "read_timeout": self.read_timeout_s,
                # One try inside botocore (total_max_attempts counts the first; max_attempts
                # would not): our retry with backoff and a deadline sits above, so a stuck
                # endpoint costs one read timeout per try, not three, and botocore's own count
                # neither cuts the budget short nor multiplies it.
                "retries": {"total_max_attempts": 1, "mode": "standard"},
            },
        }
        if self.anon:
            kwargs["anon"] = True
        elif self.key:
            kwargs["key"], kwargs["secret"] = self.key, self.secret
        return kwargs

    @classmethod
    def resolve(
        cls,
        *,
        endpoint_url: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        region: str | None = None,
        config_path: str | None = None,
        env: Mapping[str, str] | None = None,
        retry_budget_s: float | None = None,
        gcs_endpoint_url: str | None = None,
    ) -> StorageOptions:
        """Merge flags (first), a TOML config file's [s3], [gcs] and [azure] tables, then the AWS_*,
        GOOGLE_* / STORAGE_EMULATOR_HOST and AZURE_STORAGE_* variables in `env`; retry_budget_s (a flag,
        or any table's key): each call's retry budget (RetryPolicy.deadline_s)."""
        env = {} if env is None else env
        tables = _load_tables(config_path) if config_path else {}
        conf = tables.get("s3", {})

        def pick(flag: Any, conf_key: str, *env_keys: str) -> Any:
            if flag is not None:
                return flag
            if conf.get(conf_key) is not None:
                return conf[conf_key]
            for name in env_keys:
                if env.get(name):
                    return env[name]
            return None

        clouds = {**cloud_options.env_fields(env)}
        for table in ("gcs", "azure"):
            clouds.update(cloud_options.table_fields(table, tables.get(table, {}), str(config_path)))
        if gcs_endpoint_url is not None:
            clouds["gcs_endpoint_url"] = gcs_endpoint_url
        if clouds.get("gcs_endpoint_url") and "://" not in clouds["gcs_endpoint_url"]:
            clouds["gcs_endpoint_url"] = "http://" + clouds["gcs_endpoint_url"]  # STORAGE_EMULATOR_HOST form
        budget, budget_table = pick(retry_budget_s, "retry_budget_s"), "s3"
        for table in ("gcs", "azure"):
            if budget is None and tables.get(table, {}).get("retry_budget_s") is not None:
                budget, budget_table = tables[table]["retry_budget_s"], table
        return cls(
            endpoint_url=pick(endpoint_url, "endpoint_url", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            key=pick(key, "key", "AWS_ACCESS_KEY_ID"),
            secret=pick(secret, "secret", "AWS_SECRET_ACCESS_KEY"),
            region=pick(region, "region", "AWS_REGION", "AWS_DEFAULT_REGION"),
            anon=bool(conf.get("anon", False)),
            retry=_retry_policy(budget, config_path, budget_table),
            **clouds,
        )


def _load_tables(config_path: str) -> dict[str, dict[str, Any]]:
    """The [s3], [gcs] and [azure] tables of a storage config file; ValueError naming the file otherwise."""
    try:
        with open(config_path, "rb") as f:
            tables = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"storage config file {config_path!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"storage config file {config_path!r} is not valid TOML: {exc}") from None
    unknown_tables = set(tables) - {"s3", "gcs", "azure"}
    if unknown_tables:
        raise ValueError(f"unknown tables {sorted(unknown_tables)} in {config_path!r}; allowed: [s3], [gcs], [azure]")
    conf = tables.get("s3", {})
    unknown = set(conf) - set(_CONFIG_KEYS)
    if unknown:
        raise ValueError(
            f"unknown keys {sorted(unknown)} in [s3] of {config_path!r}; allowed: {', '.join(_CONFIG_KEYS)}"
        )
    return tables


_CONFIG_KEYS = ("endpoint_url", "key", "secret", "region", "anon", "retry_budget_s")


def _retry_policy(budget_s: Any, config_path: str | None, table: str = "s3") -> RetryPolicy:
    """The default RetryPolicy with `budget_s` seconds per call (None: the default budget)."""
    if budget_s is None:
        return RetryPolicy()
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        where = f" in [{table}] of {config_path!r}" if config_path else ""
        raise ValueError(f"retry_budget_s{where} must be a number of seconds above 0, got {budget_s!r}")
    return RetryPolicy(deadline_s=float(budget_s))
