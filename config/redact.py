"""Secrets out of what Tidal prints or logs: the password in every URL of a text (``user:password@``, and a
``password=`` query field), so a setting such as TIDAL_REDIS_URL can be quoted in an error."""

from __future__ import annotations

import re

MASK = "***"
# user:password@ before a host; the password runs to the last @ before a space or a slash (an unescaped @ in it)
_USERINFO = re.compile(r"(?P<user>[^\s:/@]*):(?P<password>[^\s/]+)@")
_QUERY = re.compile(r"(?P<field>[?&;](?:password|passwd|pwd)=)[^&;#\s]+", re.IGNORECASE)


def redacted(text: str) -> str:
    """``text`` with the password of each URL in it (with or without a scheme) replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['user']}:{MASK}@", text)
    return _QUERY.sub(lambda m: m["field"] + MASK, text)
