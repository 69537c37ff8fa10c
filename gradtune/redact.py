"""Credentials out of what gradtune shows: URIs are printed, logged and stored redacted.

A tracking URI such as ``http://user:password@host`` or ``postgresql://user:password@db/mlflow``
carries its password, and a query such as ``?token=...`` its token. Everything gradtune writes
(console, logs, ``summary.json``, ``report.md``, MLflow params and tags) goes through
``redact_uri`` at the point of output, so the URI a job runs with keeps its credentials and
only what is shown loses them.
"""

from __future__ import annotations

import re
import urllib.parse

HIDDEN = "***"

# Query parameters that carry a secret (token=, access_token=, password=, X-Amz-Signature=...).
_SECRET_QUERY_KEY = re.compile(r"token|passw|secret|sig|credential|key|auth", re.IGNORECASE)


def redact_uri(uri: str) -> str:
    """``uri`` with its password (``user:***@host``), a user-only login (``***@host``, often a
    token) and the values of secret-looking query parameters replaced by ``***``.

    Text that is not a URI comes back unchanged."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return uri
    netloc, query = parts.netloc, parts.query
    if "@" in netloc:
        login, _, host = netloc.rpartition("@")
        user, has_password, _ = login.partition(":")
        netloc = f"{user}:{HIDDEN}@{host}" if has_password else f"{HIDDEN}@{host}"
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_QUERY_KEY.search(k) for k, _ in pairs):
            shown = [(k, HIDDEN if _SECRET_QUERY_KEY.search(k) else v) for k, v in pairs]
            query = urllib.parse.urlencode(shown, safe="*")
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # untouched, byte for byte (urlunsplit normalises some URIs)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
