"""A multipart/form-data body read as a stream of parts, so an uploaded file goes straight to storage.

werkzeug's form parser (``request.form`` / ``request.files``) spools every file part to a temporary file before
the view runs, so an upload was written twice: once to the spool, once to the blob. Here the body is decoded as it
is read (werkzeug's own sans-I/O ``MultipartDecoder``), and a part's bytes are handed on as they arrive: the view
streams the file part into ``Blobs.write_stream`` and keeps only the small form fields.
"""

from __future__ import annotations

import typing as t

from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.sansio.multipart import Data
from werkzeug.sansio.multipart import Epilogue
from werkzeug.sansio.multipart import Field
from werkzeug.sansio.multipart import File
from werkzeug.sansio.multipart import MultipartDecoder
from werkzeug.sansio.multipart import NeedData
from werkzeug.sansio.multipart import State

from tidal_api.errors import APIError

READ_BYTES = 256 * 1024
MAX_PARTS = 64
MAX_FIELD_BYTES = 64 * 1024  # a form field (`purpose`) is short; a file is a file part
#: What the decoder may hold: it drains its buffer only inside a part's data, so while it looks for the first
#: boundary or for the end of a part's headers, junk would pile up to the whole body. One read past a part's
#: headers (at most a field's size) is plenty for any real form.
MAX_BUFFER_BYTES = READ_BYTES + MAX_FIELD_BYTES


class Malformed(Exception):
    """The body is not multipart/form-data that can be parsed (no boundary, cut short, a part without headers)."""


class Part:
    """One part of the body: a form field (``filename`` None) or a file; its bytes can be read once, in order."""

    def __init__(self, body: Body, name: str, filename: str | None):
        self._body, self.name, self.filename = body, name, filename

    def chunks(self) -> t.Iterator[bytes]:
        """The part's bytes as they arrive from the client."""
        return self._body.data()

    def text(self) -> str:
        """A form field's value (UTF-8), at most MAX_FIELD_BYTES."""
        value = bytearray()
        for chunk in self.chunks():
            value += chunk
            if len(value) > MAX_FIELD_BYTES:
                raise APIError(
                    400, f"The form field '{self.name[:64]}' is too long.", param=self.name[:64], code="invalid_value"
                )
        return value.decode("utf-8", "replace")


class Body:
    """The request body, decoded as it is read. Iterate ``parts()``; a part not read is skipped. A body that cannot
    be parsed raises Malformed."""

    def __init__(self, stream: t.IO[bytes], boundary: str | None):
        self._stream = stream
        if not boundary:
            raise Malformed("the Content-Type names no boundary")
        # RFC 2231 can name any character (boundary*=UTF-8''%E2%82%AC); RFC 2046 allows only ASCII ones
        if not boundary.isascii():
            raise Malformed("the boundary is not ASCII")
        decoder = MultipartDecoder(boundary.encode("ascii"), max_form_memory_size=MAX_BUFFER_BYTES, max_parts=MAX_PARTS)
        self._events = self._decode(decoder)

    def _decode(self, decoder: MultipartDecoder) -> t.Iterator[Field | File | Data]:
        while True:
            chunk = self._stream.read(READ_BYTES)
            try:
                decoder.receive_data(chunk or None)
            except RequestEntityTooLarge:
                raise Malformed(
                    f"no boundary, or no end of a part's headers, within {MAX_BUFFER_BYTES} bytes"
                ) from None
            try:
                while not isinstance(event := decoder.next_event(), NeedData):
                    if isinstance(event, Epilogue):
                        return
                    if isinstance(event, (Field, File, Data)):  # not the preamble
                        yield event
            except ValueError as exc:  # the decoder's word for a body it cannot parse, or one cut short
                raise Malformed(str(exc)) from None
            if decoder.state is State.EPILOGUE:  # past the closing boundary: what follows is drained, not kept
                return

    def parts(self) -> t.Iterator[Part]:
        for event in self._events:
            if isinstance(event, (Field, File)):
                yield Part(self, event.name, event.filename if isinstance(event, File) else None)
            # Data here belongs to a part its reader skipped

    def data(self) -> t.Iterator[bytes]:
        for event in self._events:
            if not isinstance(event, Data):
                raise Malformed("a part ended without its data")
            if event.data:
                yield event.data
            if not event.more_data:
                return


def drain(stream: t.IO[bytes]) -> None:
    """Read what the client is still sending, so it gets the error answer rather than a reset connection."""
    while stream.read(READ_BYTES):
        pass


__all__ = ["Body", "Malformed", "Part", "drain"]
