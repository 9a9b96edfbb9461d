"""[gcs] and [azure] storage options: config tables, variables, and their secrets redacted (no server)."""

from __future__ import annotations

import pytest

from dataio.storage.options import StorageOptions
from dataio.storage.redact import redact
from dataio.storage.retry import is_transient

KEY = "Zm9vYmFyYmF6cXV4c2VjcmV0a2V5MTIzNDU2Nzg5MA=="
CONN = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net"


def _toml(tmp_path, text: str) -> str:
    path = tmp_path / "storage.toml"
    path.write_text(text)
    return str(path)


def test_gcs_and_azure_tables_then_variables(tmp_path) -> None:
    conf = _toml(tmp_path, '[gcs]\ntoken = "/secrets/sa.json"\nproject = "p"\n'
                           f'[azure]\nconnection_string = "{CONN}"\nretry_budget_s = 9\n')
    options = StorageOptions.resolve(config_path=conf, env={"STORAGE_EMULATOR_HOST": "127.0.0.1:4443",
                                                            "AZURE_STORAGE_ACCOUNT_NAME": "other"})
    assert options.fsspec_kwargs("gs") == {"requests_timeout": 10.0, "endpoint_url": "http://127.0.0.1:4443",
                                           "token": "/secrets/sa.json", "project": "p"}
    assert options.fsspec_kwargs("az")["connection_string"] == CONN
    assert options.fsspec_kwargs("abfs")["account_name"] == "other"
    assert options.retry.deadline_s == 9
    assert options.gcs_resumable_bytes == 50 << 20
    assert StorageOptions.resolve(config_path=conf, gcs_endpoint_url="http://flag:1").gcs_endpoint_url == "http://flag:1"
    conf = _toml(tmp_path, "[gcs]\nresumable_bytes = 1024\n")
    assert StorageOptions.resolve(config_path=conf).gcs_resumable_bytes == 1024


@pytest.mark.parametrize("text, message", [
    ('[gcs]\ntokn = "x"\n', r"unknown keys \['tokn'\] in \[gcs\]"),
    ('[azure]\naccount_key = 3\n', r"account_key in \[azure\] .* must be a string"),
    ('[gcp]\ntoken = "x"\n', r"unknown tables \['gcp'\]"),
    ('[gcs]\nretry_budget_s = "soon"\n', r"retry_budget_s in \[gcs\] of .* seconds above 0"),
    ('[gcs]\nresumable_bytes = 0\n', r"resumable_bytes in \[gcs\] of .* whole number of bytes >= 1"),
    ('[gcs]\nresumable_bytes = "1MiB"\n', r"resumable_bytes in \[gcs\] of .* whole number of bytes >= 1"),
])
def test_bad_tables_are_refused_naming_the_file(tmp_path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StorageOptions.resolve(config_path=_toml(tmp_path, text))


def test_cloud_credentials_never_print() -> None:
    options = StorageOptions(gcs_token="/secrets/sa.json", azure_connection_string=CONN,
                             azure_sas_token="sv=2024-01-01&ss=b&sig=c2lnbmF0dXJlc2VjcmV0")
    assert "sa.json" not in repr(options) and KEY not in repr(options) and "c2lnbmF0" not in repr(options)
    message = (f"failed with {CONN} using /secrets/sa.json; the key {KEY} was refused; "
               "https://acct.blob.core.windows.net/c/b?sv=2024&sig=c2lnbmF0dXJlc2VjcmV0")
    out = redact(message, options.secrets)
    assert KEY not in out and "sa.json" not in out and "c2lnbmF0dXJlc2VjcmV0" not in out
    assert out.startswith("failed with *** using ***; the key *** was refused")  # the text around stays
    assert KEY not in redact(f"AccountKey={KEY};")  # the pattern alone, without knowing the key


class _HttpError(Exception):  # the shape of gcsfs's HttpError
    def __init__(self, code: int) -> None:
        super().__init__(f"error {code}")
        self.code = code


class _AzureError(Exception):  # the shape of azure.core's HttpResponseError
    def __init__(self, status_code: int) -> None:
        super().__init__("Operation returned an invalid status")
        self.status_code = status_code


_HttpError.__name__ = "HttpError"


@pytest.mark.parametrize("exc, transient", [
    (_HttpError(503), True), (_HttpError(429), True), (_HttpError(403), False), (_HttpError(400), False),
    (_AzureError(503), True), (_AzureError(500), True), (_AzureError(403), False), (_AzureError(409), False),
])
def test_cloud_statuses_are_judged_like_s3s(exc: Exception, transient: bool) -> None:
    assert is_transient(exc) is transient
