"""OpenAI's Files API over a store's files (gym.service.files): POST /v1/files (multipart: `file`, `purpose`),
GET /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id}.

The upload is parsed as it streams (python-multipart's push parser), never through Starlette's form parsing,
which would spool the whole body to disk before any check: the file part's bytes go straight to the store's
Upload, which refuses them the moment the size or a line passes its limit. The key is checked before the body
is read. Another user's file is a 404, as a file that does not exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from python_multipart.exceptions import ParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from gym.core.errors import DataError, GymError
from gym.serve.protocol import ApiError
from gym.serve.tenancy import Caller
from gym.service.files import FileInUse, FileNotFound, FileStore, FileTooLarge, Upload
from gym.service.keys import Principal

FIELD_BYTES = 1024  # a form field other than the file (purpose) is a word
FORM_SLACK = 64 << 10  # a multipart body's boundaries and headers, beyond the file's own bytes
DRAIN_BYTES = 16 << 20  # after a refusal, read this much more so the client (still sending) can read the answer


def file_routes(files: FileStore) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/files", response_model=None)
    async def upload(request: Request, who: Caller) -> dict[str, Any] | JSONResponse:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > files.limits.max_bytes + FORM_SLACK:
            return _refuse(FileTooLarge(f"The file is over the server's limit of {files.limits.max_bytes} bytes."))
        form = _StreamingForm(request, files, who)
        try:
            info = await form.receive()
        except (FileTooLarge, DataError) as exc:
            await form.drain()
            return _refuse(exc, whole=form.ended)
        return info.openai()

    @router.get("/v1/files")
    async def list_files(who: Caller, purpose: str | None = None, limit: int = 10000,
                         after: str | None = None, order: str = "desc") -> dict[str, Any]:
        if order not in ("asc", "desc"):
            raise ApiError(400, "order: 'asc' or 'desc'.", param="order")
        if not 1 <= limit <= 10000:
            raise ApiError(400, "limit: between 1 and 10000.", param="limit")
        found = await asyncio.to_thread(files.list, who, purpose)
        if order == "asc":
            found.reverse()
        ids = [f.id for f in found]
        if after is not None and after not in ids:  # starting over from the top would send a pager round in a loop
            raise ApiError(400, f"after: {after!r} is not in this list; page with an id a previous page gave.",
                           param="after")
        start = ids.index(after) + 1 if after is not None else 0
        page = found[start:start + limit]
        return {"object": "list", "data": [f.openai() for f in page], "has_more": start + limit < len(found),
                "first_id": page[0].id if page else None, "last_id": page[-1].id if page else None}

    @router.get("/v1/files/{file_id}")
    async def get_file(file_id: str, who: Caller) -> dict[str, Any]:
        return (await _found(files.get, who, file_id)).openai()

    @router.get("/v1/files/{file_id}/content")
    async def content(file_id: str, who: Caller) -> FileResponse:
        info = await _found(files.get, who, file_id)
        return FileResponse(files.path(info.id), media_type="application/octet-stream", filename=info.filename)

    @router.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str, who: Caller) -> dict[str, Any]:
        try:
            await _found(files.delete, who, file_id)
        except FileInUse as exc:
            raise ApiError(409, str(exc), param="file_id", code="file_in_use") from None
        return {"id": file_id, "object": "file", "deleted": True}

    return router


def _refuse(exc: GymError, whole: bool = False) -> JSONResponse:
    """The 4xx of a refused upload. Unless the whole body was read, the connection is closed after it: otherwise the
    server would go on reading (and dropping) the rest of a 1 GB body to keep the connection for another request."""
    status, code = (413, "file_too_large") if isinstance(exc, FileTooLarge) else (400, "invalid_file")
    param = "purpose" if str(exc).startswith("purpose ") else "file"  # the form field the refusal is about
    error = ApiError(status, str(exc), param=param, code=code)
    return JSONResponse(error.body(), status_code=status, headers={} if whole else {"Connection": "close"})


async def _found(call: Callable[[Principal, str], Any], who: Principal, file_id: str) -> Any:
    try:
        return await asyncio.to_thread(call, who, file_id)
    except FileNotFound as exc:
        raise ApiError(404, str(exc), param="file_id", code="file_not_found") from None


class _StreamingForm:
    """A multipart/form-data body read chunk by chunk: the `file` part into an Upload, `purpose` into a string."""

    def __init__(self, request: Request, files: FileStore, who: Principal) -> None:
        self.request, self.files, self.who = request, files, who
        self.upload: Upload | None = None
        self.fields: dict[str, bytes] = {}
        self._part: dict[str, Any] = {}
        self._headers: dict[bytes, bytes] = {}
        self._header = b""
        self._received = 0
        self.ended = False  # the body's last chunk was read
        self.complete = False  # the parser saw the closing boundary

    async def receive(self) -> Any:
        kind, options = parse_options_header(self.request.headers.get("content-type", ""))
        if kind != b"multipart/form-data" or b"boundary" not in options:
            raise DataError("Send the file as multipart/form-data with fields `file` and `purpose`.")
        parser = MultipartParser(options[b"boundary"], {
            "on_part_begin": self._begin, "on_header_field": self._field, "on_header_value": self._value,
            "on_header_end": self._header_end, "on_headers_finished": self._headers_done,
            "on_part_data": self._data, "on_end": self._end})
        try:
            while not self.ended:
                chunk = await self._next()
                if self._received > self.files.limits.max_bytes + FORM_SLACK:
                    raise FileTooLarge(f"The file is over the server's limit of {self.files.limits.max_bytes} bytes.")
                if chunk:
                    await asyncio.to_thread(parser.write, chunk)  # the upload writes to disk: off the event loop
            parser.finalize()
        except ParseError as exc:
            if self.upload is not None:
                self.upload.abort()
            raise DataError(f"The body is not valid multipart/form-data ({exc}).") from None
        except BaseException:
            if self.upload is not None:
                self.upload.abort()
            raise
        try:
            if not self.complete:  # a truncated body must not pass for a shorter file
                raise DataError("The multipart body ended before its closing boundary.")
            if self.upload is None:
                raise DataError("file: missing; send the file in a form field named `file`.")
            purpose = self.fields.get("purpose", b"").decode("utf-8", "replace")
            if purpose != self.upload.purpose:
                raise DataError(f"purpose {purpose!r}: this server takes files for 'fine-tune' only.")
            return await asyncio.to_thread(self.upload.finish)
        except BaseException:
            if self.upload is not None:
                self.upload.abort()
            raise

    async def drain(self) -> None:
        """Read and drop some more of a refused body so that the client, still sending, reads the answer; then
        stop (the connection is closed after the answer). Read from `receive` itself: the stream that was
        being read cannot be iterated again."""
        while not self.ended and self._received < self.files.limits.max_bytes + DRAIN_BYTES:
            try:
                await self._next()
            except DataError:
                return

    async def _next(self) -> bytes:
        message = await self.request.receive()
        if message["type"] != "http.request":
            self.ended = True
            raise DataError("The client went away before the file was whole.")
        body: bytes = message.get("body", b"")
        self._received += len(body)
        self.ended = not message.get("more_body", False)
        return body

    # python-multipart callbacks (run in a worker thread, one chunk at a time)
    def _begin(self) -> None:
        self._part, self._headers = {}, {}

    def _field(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def _value(self, data: bytes, start: int, end: int) -> None:
        name = self._header.lower()
        value = self._headers.get(name, b"") + data[start:end]
        if len(value) > FIELD_BYTES:
            raise DataError("A multipart header is too long.")
        self._headers[name] = value

    def _header_end(self) -> None:
        self._header = b""

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._part = {"name": name}
        if name == "file":
            if self.upload is not None:
                raise DataError("file: send one file per upload.")
            filename = options.get(b"filename", b"upload.jsonl").decode("utf-8", "replace")
            # purpose is checked against the form's own field once the body has ended (it may come after the file)
            self.upload = self.files.upload(self.who, filename, "fine-tune")

    def _end(self) -> None:
        self.complete = True

    def _data(self, data: bytes, start: int, end: int) -> None:
        name = self._part.get("name")
        if name == "file":
            assert self.upload is not None
            self.upload.write(data[start:end])
        elif name:
            value = self.fields.get(name, b"") + data[start:end]
            if len(value) > FIELD_BYTES:
                raise DataError(f"{name}: too long for a form field.")
            self.fields[name] = value
