"""Credentials out of text: every URL or error message that leaves dataio.storage passes `redact`."""

from __future__ import annotations

import re
from urllib.parse import unquote

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
# "KEY:SECRET@bucket" without its scheme, as botocore quotes a bucket name back in its errors.
_BARE_USERINFO = re.compile(r"(?<![\w.+%~/-])[\w.+%~-]+:[^\s/@\"']+@(?=[\w.-])")
_URL_USERINFO = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://(?P<user>[^/@\s:]*)(?::(?P<password>[^/@\s]*))?@")
# upload_id: a GCS resumable session URI's, which lets its holder write the object.
_SECRET_QUERY = re.compile(
    r"(?i)(?P<name>x-amz-credential|x-amz-signature|x-amz-security-token|awsaccesskeyid|"
    r"signature|sig|token|access_token|secret|password|accountkey|sharedaccesssignature|client_secret|"
    r"upload_id)"
    r"=[^&;\s\"']+"
)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove credentials from a URL or message: user:pass@ parts, signed-URL query values, known secrets."""
    out = str(text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, "***")
    out = _USERINFO.sub(lambda m: m.group("scheme") + "***@", out)
    out = _BARE_USERINFO.sub("***@", out)
    return _SECRET_QUERY.sub(lambda m: m.group("name") + "=***", out)


def url_secrets(url: str) -> tuple[str, ...]:
    """The credentials a URL carries (user:password@ and signed-query values), to redact wherever they reappear."""
    url = str(url)
    found: list[str] = []
    m = _URL_USERINFO.match(url)
    if m:
        found += [v for v in (m.group("user"), m.group("password")) if v]
    found += [q.group(0).split("=", 1)[1] for q in _SECRET_QUERY.finditer(url)]
    found += [unquote(v) for v in found if unquote(v) != v]  # a client may quote them back decoded
    return tuple(dict.fromkeys(found))


def connection_string_secrets(text: str) -> list[str]:
    """The secret values of an Azure connection string ("AccountKey=...;SharedAccessSignature=..."):
    each is redacted wherever it reappears, also alone (a client may quote the key back)."""
    found: list[str] = []
    for part in str(text).split(";"):
        name, _, value = part.partition("=")
        if name.strip().lower() in ("accountkey", "sharedaccesssignature") and value:
            found.append(value.strip())
            if name.strip().lower() == "sharedaccesssignature":
                found += url_secrets("?" + value.strip())
    return found


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """(url without user:password@, user, password); (url, None, None) when it carries none."""
    url = str(url)
    m = _URL_USERINFO.match(url)
    if not m:
        return url, None, None
    user, password = m.group("user"), m.group("password")
    return (f"{url.split('://', 1)[0]}://{url[m.end():]}", unquote(user) if user else None,
            unquote(password) if password else None)


def chain_needs_redacting(exc: BaseException, secrets: tuple[str, ...] = ()) -> bool:
    """True when the text of `exc`, or of any exception it was raised from, holds a credential."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for text in (str(current), repr(current)):
            if redact(text, secrets) != text:
                return True
        current = current.__cause__ or current.__context__
    return False
