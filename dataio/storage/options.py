"""StorageOptions: the endpoint, credentials and policies a Store is opened with.

Credentials come from flags, a config file or the standard AWS variables (in that order); they
are kept out of reprs and never appear in a message (see dataio.storage.redact).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dataio.storage.hedge import HedgePolicy
from dataio.storage.retry import RetryPolicy


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageOptions:
    """Where an object store is and who we are there; key and secret never print."""

    endpoint_url: str | None = None
    key: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)
    region: str | None = None
    anon: bool = False
    # With one botocore attempt per try and RetryPolicy.deadline_s over the tries, an endpoint
    # that accepts connections but never answers fails a first request (FIRST_REQUEST_DEADLINE_S)
    # after two read timeouts; a healthy store rarely goes 10 s without sending a byte, and
    # when a loaded one does, the retry gets a second chance.
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    # Reads of remote stores slower than k x their recent median get a second request
    # (dataio.storage.hedge); None: never.
    hedge: HedgePolicy | None = HedgePolicy()
    # How each call retries transient errors: backoff until its time budget (deadline_s, 2 minutes)
    # is spent; a Store given its own RetryPolicy uses that one instead.
    retry: RetryPolicy = RetryPolicy()

    def __post_init__(self) -> None:
        if (self.key is None) != (self.secret is None):
            raise ValueError("give both an access key and a secret key, or neither")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("storage timeouts must be positive")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")

    @property
    def secrets(self) -> tuple[str, ...]:
        return tuple(s for s in (self.key, self.secret) if s)

    def fsspec_kwargs(self, protocol: str) -> dict[str, Any]:
        """Keyword arguments for fsspec's filesystem of `protocol` (only S3 takes any)."""
        if protocol not in ("s3", "s3a"):
            return {}
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
    ) -> StorageOptions:
        """Merge flags (first), a TOML config file's [s3] table, then AWS_* variables in `env`;
        retry_budget_s (a flag, or the table's key): each call's retry budget (RetryPolicy.deadline_s)."""
        env = {} if env is None else env
        conf: dict[str, Any] = {}
        if config_path:
            try:
                with open(config_path, "rb") as f:
                    conf = tomllib.load(f).get("s3", {})
            except FileNotFoundError:
                raise ValueError(f"storage config file {config_path!r} does not exist") from None
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"storage config file {config_path!r} is not valid TOML: {exc}") from None
            unknown = set(conf) - set(_CONFIG_KEYS)
            if unknown:
                raise ValueError(
                    f"unknown keys {sorted(unknown)} in [s3] of {config_path!r}; allowed: {', '.join(_CONFIG_KEYS)}"
                )

        def pick(flag: Any, conf_key: str, *env_keys: str) -> Any:
            if flag is not None:
                return flag
            if conf.get(conf_key) is not None:
                return conf[conf_key]
            for name in env_keys:
                if env.get(name):
                    return env[name]
            return None

        return cls(
            endpoint_url=pick(endpoint_url, "endpoint_url", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
            key=pick(key, "key", "AWS_ACCESS_KEY_ID"),
            secret=pick(secret, "secret", "AWS_SECRET_ACCESS_KEY"),
            region=pick(region, "region", "AWS_REGION", "AWS_DEFAULT_REGION"),
            anon=bool(conf.get("anon", False)),
            retry=_retry_policy(pick(retry_budget_s, "retry_budget_s"), config_path),
        )


_CONFIG_KEYS = ("endpoint_url", "key", "secret", "region", "anon", "retry_budget_s")


def _retry_policy(budget_s: Any, config_path: str | None) -> RetryPolicy:
    """The default RetryPolicy with `budget_s` seconds per call (None: the default budget)."""
    if budget_s is None:
        return RetryPolicy()
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        where = f" in [s3] of {config_path!r}" if config_path else ""
        raise ValueError(f"retry_budget_s{where} must be a number of seconds above 0, got {budget_s!r}")
    return RetryPolicy(deadline_s=float(budget_s))
