"""Integers read from query strings and form fields: ASCII digits only.

``int()`` and ``str.isdigit`` accept any Unicode digit (``int("٣٦٠٠")`` is 3600; ``"²".isdigit()`` is true but
``int("²")`` raises), so a form value is matched against ASCII digits before it is converted.
"""

from __future__ import annotations

import re

_DECIMAL = re.compile(r"[+-]?[0-9]+")


def ascii_int(text: str) -> int | None:
    """The integer ``text`` writes in ASCII digits (an optional sign, blanks around it), or None."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


__all__ = ["ascii_int"]
