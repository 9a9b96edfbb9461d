"""Credentials out of text: every URL or error message that leaves dataio.storage passes `redact`."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
_SECRET_QUERY = re.compile(
    r"(?i)(?P<name>x-amz-credential|x-amz-signature|x-amz-security-token|awsaccesskeyid|"
    r"signature|sig|token|access_token|secret|password)=[^&\s]+"
)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """Remove credentials from a URL or message: user:pass@ parts, signed-URL query values, known secrets."""
    out = _USERINFO.sub(lambda m: m.group("scheme") + "***@", str(text))
    out = _SECRET_QUERY.sub(lambda m: m.group("name") + "=***", out)
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, "***")
    return out


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
