"""Google Cloud Storage and Azure Blob options: the [gcs] and [azure] tables of a storage config file,
the keyword arguments gcsfs and adlfs are opened with, and their own retries turned off.

One layer of retries, ours (dataio.storage.retry), spends each call's time budget: gcsfs retries 6
times with up to 32 s sleeps and Azure's SDK 3 times with exponential waits of its own (a refused
write took 169 s on Azurite); below ours they multiply the budget, so both are cut to one try.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")

# Config-file key -> StorageOptions field, per table.
GCS_KEYS = {"endpoint_url": "gcs_endpoint_url", "token": "gcs_token", "project": "gcs_project",
            "resumable_bytes": "gcs_resumable_bytes", "retry_budget_s": None}
_NUMBERS = ("retry_budget_s", "resumable_bytes")  # checked below and by options._retry_policy
AZURE_KEYS = {"account_name": "azure_account_name", "account_key": "azure_account_key",
              "connection_string": "azure_connection_string", "sas_token": "azure_sas_token",
              "retry_budget_s": None}


def table_fields(table: str, conf: Mapping[str, Any], config_path: str) -> dict[str, Any]:
    """StorageOptions fields from the [gcs] or [azure] table `conf`; ValueError for an unknown key."""
    keys = GCS_KEYS if table == "gcs" else AZURE_KEYS
    unknown = set(conf) - set(keys)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} in [{table}] of {config_path!r}; "
                         f"allowed: {', '.join(keys)}")
    for key, value in conf.items():
        if key not in _NUMBERS and not isinstance(value, str):
            raise ValueError(f"{key} in [{table}] of {config_path!r} must be a string")
        if key == "resumable_bytes" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"resumable_bytes in [{table}] of {config_path!r} must be a whole number of bytes "
                             f">= 1 (objects at least this large go up as resumable uploads), got {value!r}")
    return {keys[k]: v for k, v in conf.items() if keys[k] is not None}


def env_fields(env: Mapping[str, str]) -> dict[str, Any]:
    """StorageOptions fields from the clouds' standard variables (a flag or the config file wins)."""
    names = {"gcs_endpoint_url": "STORAGE_EMULATOR_HOST", "gcs_token": "GOOGLE_APPLICATION_CREDENTIALS",
             "gcs_project": "GOOGLE_CLOUD_PROJECT", "azure_account_name": "AZURE_STORAGE_ACCOUNT_NAME",
             "azure_account_key": "AZURE_STORAGE_ACCOUNT_KEY",
             "azure_connection_string": "AZURE_STORAGE_CONNECTION_STRING",
             "azure_sas_token": "AZURE_STORAGE_SAS_TOKEN"}
    return {field: env[name] for field, name in names.items() if env.get(name)}


def fsspec_kwargs(options: Any, protocol: str) -> dict[str, Any]:
    """gcsfs / adlfs keyword arguments for `options` (a StorageOptions; typed Any: options.py imports
    this module); {} for other protocols."""
    if protocol in GCS_PROTOCOLS:
        kwargs: dict[str, Any] = {"requests_timeout": options.read_timeout_s}
        if options.gcs_endpoint_url:
            kwargs["endpoint_url"] = options.gcs_endpoint_url
        if options.anon:
            kwargs["token"] = "anon"
        elif options.gcs_token:
            kwargs["token"] = options.gcs_token
        if options.gcs_project:
            kwargs["project"] = options.gcs_project
        return kwargs
    if protocol in AZURE_PROTOCOLS:
        kwargs = {"connection_timeout": int(max(1, options.connect_timeout_s)),
                  "read_timeout": int(max(1, options.read_timeout_s))}
        for name in ("account_name", "account_key", "connection_string", "sas_token"):
            value = getattr(options, f"azure_{name}")
            if value:
                kwargs[name] = value
        if options.anon:
            kwargs["anon"] = True
        return kwargs
    return {}


def one_try(fs: Any, protocol: str) -> None:
    """Cut the client library's own retries of `fs` to one try: ours spend the budget."""
    if protocol in GCS_PROTOCOLS:
        from gcsfs.retry import retry_request

        inner = type(fs)._request.__wrapped__  # gcsfs fixes 6 tries when its class is defined
        fs._request = types.MethodType(retry_request(retries=1)(inner), fs)
    elif protocol in AZURE_PROTOCOLS:
        client = getattr(fs, "service_client", None)
        policy = getattr(getattr(client, "_config", None), "retry_policy", None)
        for name in ("total_retries", "connect_retries", "read_retries", "status_retries"):
            if hasattr(policy, name):
                setattr(policy, name, 0)
