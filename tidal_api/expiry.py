"""OpenAI's expiration policies: ``expires_after`` on an upload, ``output_expires_after`` on a batch.

Both are ``{"anchor": "created_at", "seconds": N}`` with N from 3600 (one hour) to 2592000 (30 days): the file
expires N seconds after it was created (for a batch's output and error files, after finalize wrote them). Beat's
retention sweep deletes an expired file, bytes and row. Without one, a file expires after
``TIDAL_FILE_EXPIRY_SECONDS``.
"""

from __future__ import annotations

import typing as t

from tidal_api.errors import invalid_type
from tidal_api.errors import invalid_value
from tidal_api.errors import missing
from tidal_api.numbers import ascii_int

ANCHORS = ("created_at",)
MIN_SECONDS, MAX_SECONDS = 3600, 30 * 86_400


def seconds_after(anchor: t.Any, seconds: t.Any, param: str) -> int:
    """The policy's seconds, checked."""
    if anchor is None:
        raise missing(f"{param}.anchor")
    if anchor not in ANCHORS:
        raise invalid_value(
            f"{param}.anchor",
            f"Invalid value for '{param}.anchor': '{str(anchor)[:32]}'. Supported values are: 'created_at'.",
        )
    if seconds is None:
        raise missing(f"{param}.seconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise invalid_type(f"{param}.seconds", "an integer")
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise invalid_value(
            f"{param}.seconds",
            f"Invalid '{param}.seconds': must be between {MIN_SECONDS} and {MAX_SECONDS}, got {seconds}.",
        )
    return seconds


def from_json(value: t.Any, param: str) -> int | None:
    """``output_expires_after`` (or any such object) from a JSON body; None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_type(param, "an object with 'anchor' and 'seconds'")
    if extra := set(value) - {"anchor", "seconds"}:
        raise invalid_value(param, f"Unknown parameter: '{param}.{sorted(extra)[0][:32]}'.")
    return seconds_after(value.get("anchor"), value.get("seconds"), param)


def from_form(form: t.Mapping[str, str], param: str) -> int | None:
    """``expires_after`` from multipart fields ``expires_after[anchor]`` and ``expires_after[seconds]``."""
    anchor, seconds = form.get(f"{param}[anchor]"), form.get(f"{param}[seconds]")
    if anchor is None and seconds is None:
        return None
    number = ascii_int(seconds) if seconds is not None else None
    return seconds_after(anchor, seconds if number is None else number, param)
