"""Credentials out of everything the trainer writes: one scrub, the storage layer's `redact`, for every record.

A run's secrets are what its URLs carry (s3://KEY:SECRET@..., signed queries) and what its storage
options hold (flags, --storage-config's [s3] table, AWS_* variables). metrics.jsonl, summary.json,
checkpoints' saved config, notes, the printed summary and error messages pass `scrub`; saved
configs keep the redacted URL (s3://***@bucket/...), so a resumed run takes its credentials from
the environment, the storage config or its flags, never from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dataio.storage.redact import redact, url_secrets


def secrets_of(texts: Iterable[str], known: Iterable[str] = ()) -> tuple[str, ...]:
    """The credentials that `texts` (URLs, flags) carry, plus `known` ones (key and secret of the storage options)."""
    found = [s for text in texts for s in url_secrets(str(text))]
    return tuple(dict.fromkeys([*found, *(k for k in known if k)]))


def scrub(value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """`value` with every string in it (dict keys and values, list items) redacted: user:pass@ parts,
    signed-URL query values and each of `secrets`."""
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {scrub(k, secrets): scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    if isinstance(value, tuple):
        return tuple(scrub(v, secrets) for v in value)
    return value
