"""Cursor pages in creation order, OpenAI's list shape: {object, data, first_id, last_id, has_more}.

The cursor ``after`` is the id of the last object the client saw. Keyset
paging on (seq, id) stays correct while rows are inserted, and needs no
offsets; ``seq`` is the row's creation number (``models.NextSeq``), so objects
created within one second still list in the order they were made, which
``created_at`` (whole seconds) cannot tell. An ``after`` the caller does not own answers 404 like any unknown id
rather than an empty page, which a client's loop would take for the end of the list.
"""

from __future__ import annotations

import typing as t

from sqlalchemy import Select
from sqlalchemy import and_
from sqlalchemy import or_
from sqlalchemy import select
from sqlalchemy.orm import Session

from tidal_api.errors import APIError
from tidal_api.errors import invalid_type
from tidal_api.errors import invalid_value
from tidal_api.numbers import ascii_int


def can_name_a_row(value: str) -> bool:
    """PostgreSQL refuses NUL in text parameters; such a value names no row, on either database."""
    return "\x00" not in value


def int_arg(args: t.Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = args.get(name)
    if raw is None:
        return default
    value = ascii_int(raw)
    if value is None:
        raise invalid_type(name, "an integer")
    if not low <= value <= high:
        raise invalid_value(name, f"Invalid '{name}': must be between {low} and {high}, got {value}.")
    return value


def order_arg(args: t.Mapping[str, str]) -> str:
    order = args.get("order") or "desc"
    if order not in ("asc", "desc"):
        raise invalid_value("order", f"Invalid 'order': expected 'asc' or 'desc', got '{order}'.")
    return order


def keyset_page(
    session: Session,
    stmt: Select,
    model: t.Any,
    *,
    tenant: str,
    after: str | None,
    limit: int,
    order: str,
    not_found: APIError,
) -> tuple[list, bool]:
    """Rows of ``stmt`` (already filtered to the tenant) after the cursor; (rows, has_more).

    The cursor may name a row ``stmt`` filters out (a file deleted while the client
    pages through a list), so it is looked up among all the tenant's rows.
    """
    seq, ident = model.seq, model.id
    if after:
        anchor = None
        if can_name_a_row(after):
            anchor = session.scalar(select(seq).where(ident == after, model.tenant_id == tenant))
        if anchor is None:
            raise not_found
        if order == "desc":
            stmt = stmt.where(or_(seq < anchor, and_(seq == anchor, ident < after)))
        else:
            stmt = stmt.where(or_(seq > anchor, and_(seq == anchor, ident > after)))
    keys = (seq.desc(), ident.desc()) if order == "desc" else (seq.asc(), ident.asc())
    rows = list(session.scalars(stmt.order_by(*keys).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def list_body(data: list[dict], has_more: bool) -> dict:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
