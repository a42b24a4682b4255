"""Uploaded files (OpenAI's Files API): training data for fine-tuning jobs, owned by the user whose key sent them.

A file is received as a stream into a temporary name under `<store>/.service/files/`, checked, and only then
renamed to its id and recorded: a refused upload (too large, a line too long, a bad row, over the user's quota)
leaves nothing behind. Limits are enforced while the bytes arrive, so a 1 GB upload is stopped at the size limit
and a 10 MB line at the line limit, without holding either in memory.

Rows are JSON lines in one of OpenAI's fine-tuning formats, every row the same:
  chat        {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ...}, ...]}
  preference  {"input": {"messages": [...]}, "preferred_output": [{"role": "assistant", ...}],
               "non_preferred_output": [{"role": "assistant", ...}]}         (DPO)
Messages are read by gym.data.messages, as training reads them; an error names the line and the field.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from gym.core.errors import DataError, GymError
from gym.data.messages import ASSISTANT, OPENAI, MessageProblem, read_conversation
from gym.data.tools import ToolError, parse_tools
from gym.service.db import ACTIVE_STATES, Database, Job, StoredFile, now
from gym.service.keys import Principal
from gym.service.limits import FileLimits

FILES_DIR = Path(".service") / "files"
PURPOSES = ("fine-tune",)
MAX_FILENAME = 255


class FileTooLarge(GymError):
    """An upload over the size limit, or over what is left of its owner's quota."""


class FileNotFound(GymError):
    """No such file, or one the caller may not see (the same answer: another user's file is not there for them)."""


class FileInUse(GymError):
    """A file an unfinished fine-tuning job still reads."""


@dataclass(frozen=True)
class FileInfo:
    id: str
    user_id: str | None
    filename: str
    purpose: str
    bytes: int
    rows: int
    kind: str
    created_at: int

    def openai(self) -> dict[str, Any]:
        """OpenAI's file object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed", "status_details": None,
                "expires_at": None}


class FileStore:
    def __init__(self, store_dir: str | Path, db: Database, limits: FileLimits | None = None) -> None:
        self.root = Path(store_dir).expanduser() / FILES_DIR
        self.db = db
        self.limits = limits or FileLimits()

    def path(self, file_id: str) -> Path:
        return self.root / file_id

    def upload(self, owner: Principal, filename: str, purpose: str) -> Upload:
        """Begin receiving a file for `owner`: write() its bytes, then finish() (or abort())."""
        if purpose not in PURPOSES:
            raise DataError(f"purpose {purpose!r}: this server takes files for {', '.join(PURPOSES)} only.")
        name = os.path.basename(filename.replace("\\", "/")).strip() or "upload.jsonl"
        if len(name) > MAX_FILENAME or any(ord(c) < 32 for c in name):
            raise DataError("filename: at most 255 characters, no control characters.")
        self.root.mkdir(parents=True, exist_ok=True)
        return Upload(self, owner, name, purpose, self.used_bytes(owner.user_id))

    def used_bytes(self, user_id: str | None) -> int:
        with self.db.session() as session:
            return int(session.scalar(select(func.coalesce(func.sum(StoredFile.bytes), 0))
                                      .where(StoredFile.user_id == user_id)) or 0)

    def list(self, caller: Principal, purpose: str | None = None) -> list[FileInfo]:
        """The files `caller` may see, newest first."""
        query = select(StoredFile).order_by(StoredFile.created_at.desc(), StoredFile.id.desc())
        if not caller.admin:
            query = query.where(StoredFile.user_id == caller.user_id)
        if purpose is not None:
            query = query.where(StoredFile.purpose == purpose)
        with self.db.session() as session:
            return [_info(row) for row in session.scalars(query)]

    def get(self, caller: Principal, file_id: str) -> FileInfo:
        with self.db.session() as session:
            row = session.get(StoredFile, file_id)
            if row is None or not caller.may_see(row.user_id):
                raise FileNotFound(f"No such file: {file_id!r}.")
            return _info(row)

    def delete(self, caller: Principal, file_id: str) -> None:
        """Forget the file, then remove its bytes. A file an unfinished job reads is kept (cancel the job first)."""
        with self.db.session(write=True) as session:
            row = session.get(StoredFile, file_id)
            if row is None or not caller.may_see(row.user_id):
                raise FileNotFound(f"No such file: {file_id!r}.")
            job = session.scalar(select(Job.id).where(Job.status.in_(ACTIVE_STATES)).where(
                (Job.training_file == file_id) | (Job.validation_file == file_id)).limit(1))
            if job is not None:
                raise FileInUse(f"File {file_id} is used by fine-tuning job {job}, which has not finished; cancel it "
                                "first.")
            session.delete(row)
        self.path(file_id).unlink(missing_ok=True)


class Upload:
    """One file arriving: `write` checks the size and line limits as bytes come, `finish` checks the rows and the
    quota and makes it a file; any refusal removes the temporary file."""

    def __init__(self, files: FileStore, owner: Principal, filename: str, purpose: str, used: int) -> None:
        self.files, self.owner, self.filename, self.purpose = files, owner, filename, purpose
        limits = files.limits
        # The owner's quota counts too: an admin's uploads (no user) are bounded by the file limit only.
        left = limits.quota_bytes - used if owner.user_id is not None else limits.max_bytes
        self.max_bytes = min(limits.max_bytes, left)
        self.quota_bound = left < limits.max_bytes
        self.temp = files.root / f".upload-{uuid.uuid4().hex}.tmp"
        self._out = self.temp.open("xb")
        self.size = 0
        self._line = 0  # bytes of the line being received so far
        self._line_no = 1

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            self.abort()
            if self.quota_bound:
                raise FileTooLarge(f"The file is over what is left of your storage quota ({max(self.max_bytes, 0)} "
                                   f"of {self.files.limits.quota_bytes} bytes); delete files you no longer need.")
            raise FileTooLarge(f"The file is over the server's limit of {self.max_bytes} bytes.")
        pieces = chunk.split(b"\n")
        for i, piece in enumerate(pieces):
            self._line += len(piece)
            if self._line > self.files.limits.max_line_bytes:
                self.abort()
                raise DataError(f"line {self._line_no}: longer than the server's limit of "
                                f"{self.files.limits.max_line_bytes} bytes a line.")
            if i < len(pieces) - 1:
                self._line, self._line_no = 0, self._line_no + 1
        self._out.write(chunk)

    def finish(self) -> FileInfo:
        """Check every row, then record the file (within the owner's quota, checked again under the write lock
        against concurrent uploads) and move it to its name."""
        moved: Path | None = None
        try:
            self._out.close()
            rows, kind = check_rows(self.temp, self.files.limits.max_rows)
            # nanoseconds first, as job ids: "newest first" is the order of the ids, even within one second (a
            # random id left files uploaded in the same second listed in any order)
            file_id = f"file-{time.time_ns():016x}{secrets.token_hex(4)}"
            db = self.files.db
            with db.session(write=True) as session:
                if self.owner.user_id is not None:
                    db.lock(session, f"files:{self.owner.user_id}")
                    used = int(session.scalar(select(func.coalesce(func.sum(StoredFile.bytes), 0))
                                              .where(StoredFile.user_id == self.owner.user_id)) or 0)
                    if used + self.size > self.files.limits.quota_bytes:
                        raise FileTooLarge(f"This file ({self.size} bytes) would take you over your storage quota "
                                           f"({used} of {self.files.limits.quota_bytes} bytes used); delete files "
                                           "you no longer need.")
                row = StoredFile(id=file_id, user_id=self.owner.user_id, filename=self.filename,
                                 purpose=self.purpose, bytes=self.size, rows=rows, kind=kind, created_at=now())
                session.add(row)
                session.flush()  # the row is valid before the file takes its name
                moved = self.files.path(file_id)
                os.replace(self.temp, moved)  # the row commits as the block ends; if it does not, the file goes
            return _info(row)
        except BaseException:
            self.abort()
            if moved is not None:
                moved.unlink(missing_ok=True)
            raise

    def abort(self) -> None:
        self._out.close()
        self.temp.unlink(missing_ok=True)


def check_rows(path: Path, max_rows: int) -> tuple[int, str]:
    """(number of rows, "chat" or "preference") for a JSONL file in one of OpenAI's fine-tuning formats; a
    DataError naming the line and the field of the first bad row."""
    rows, kind = 0, None
    constants: list[str] = []

    def constant(token: str) -> _NonStandardNumber:
        constants.append(token)
        return _NonStandardNumber(token)

    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            rows += 1
            if rows > max_rows:
                raise DataError(f"line {line_no}: more than the server's limit of {max_rows} rows.")
            try:
                row = json.loads(raw.decode("utf-8"), parse_constant=constant)
            except UnicodeDecodeError:
                raise DataError(f"line {line_no}: not UTF-8 text.") from None
            except json.JSONDecodeError as exc:
                raise DataError(f"line {line_no}: not valid JSON (column {exc.colno}): {exc.msg}.") from None
            except RecursionError:  # `[[[[...` a few thousand deep: the parser's own stack, not a server fault
                raise DataError(f"line {line_no}: JSON nested too deeply to be a fine-tuning row.") from None
            found = _non_standard_number(row) if constants else None  # walked only for a row that has one
            if found is not None:
                where, token = found
                raise DataError(f"line {line_no}: {where or 'the row'} is {token}, which is not valid JSON (JSON "
                                "has no NaN or Infinity); give a number or null.")
            row_kind = _row_kind(row, line_no)
            if kind is not None and row_kind != kind:
                raise DataError(f"line {line_no}: a {row_kind} row in a file of {kind} rows; every row takes one "
                                "format.")
            kind = row_kind
            try:
                _check_row(row, row_kind)
            except MessageProblem as exc:
                raise DataError(f"line {line_no}: {exc.field} {exc.problem}") from None
    if kind is None:
        raise DataError("The file has no rows: give JSON lines such as {\"messages\": [...]}.")
    return rows, kind


class _NonStandardNumber(str):
    """`NaN`, `Infinity` or `-Infinity` where a row had one: Python's json takes them, as no other JSON parser
    does, and they would reach the job (a tool's schema, a message's weight) as floats that are no number."""


def _non_standard_number(row: Any) -> tuple[str, str] | None:
    """(the field, as `messages[1].weight`, and the token) of the first NaN or Infinity in a parsed row, or None.
    A loop, not recursion: a row nested as deep as the parser allows would otherwise pass the stack's limit here."""
    stack: list[tuple[Any, str]] = [(row, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, _NonStandardNumber):
            return where, str(value)
        if isinstance(value, dict):
            stack += reversed([(item, f"{where}.{key}" if where else str(key)) for key, item in value.items()])
        elif isinstance(value, list):
            stack += reversed([(item, f"{where}[{i}]") for i, item in enumerate(value)])
    return None


def _row_kind(row: Any, line_no: int) -> str:
    if not isinstance(row, dict):
        raise DataError(f"line {line_no}: a row is a JSON object such as {{\"messages\": [...]}}, not a "
                        f"{type(row).__name__}.")
    if isinstance(row, dict) and "messages" in row:
        return "chat"
    if isinstance(row, dict) and "input" in row:
        return "preference"
    raise DataError(f"line {line_no}: messages: missing; a row is {{\"messages\": [...]}} (chat) or {{\"input\": "
                    "{\"messages\": [...]}, \"preferred_output\": [...], \"non_preferred_output\": [...]} "
                    "(preference).")


def _check_row(row: dict[str, Any], kind: str) -> None:
    if kind == "chat":
        _, messages = read_conversation(row["messages"], OPENAI, "messages")
        if not any(m["role"] == ASSISTANT for m in messages):
            raise MessageProblem("messages", "has no assistant message: there is nothing to learn from.")
        for i, message in enumerate(row["messages"]):
            _check_weight(message, f"messages[{i}].weight")
        if row.get("tools") is not None:  # training reads them as this does: a bad list failed the job, not the upload
            try:
                parse_tools(row["tools"])
            except ToolError as exc:
                raise MessageProblem("tools", f"is not a valid tool list: {exc}.") from None
        return
    given = row["input"]
    if not isinstance(given, dict):
        raise MessageProblem("input", "must be an object with messages.")
    read_conversation(given.get("messages"), OPENAI, "input.messages")
    for key in ("preferred_output", "non_preferred_output"):
        answer = row.get(key)
        if not isinstance(answer, list) or not answer:
            raise MessageProblem(key, "must be a non-empty list of assistant messages.")
        for i, message in enumerate(answer):
            if not isinstance(message, dict) or message.get("role") != ASSISTANT:
                raise MessageProblem(f"{key}[{i}].role", "must be 'assistant'.")
            if not isinstance(message.get("content"), str) and not message.get("tool_calls"):
                raise MessageProblem(f"{key}[{i}].content", "must be a string.")


def _check_weight(message: Any, field: str) -> None:
    """OpenAI's per-message `weight` (0: not trained on). Training trains every assistant message, so a 0 would be
    trained on regardless: refused, as a feature the server does not have, rather than silently ignored."""
    if not isinstance(message, dict) or "weight" not in message:
        return
    weight = message["weight"]
    if isinstance(weight, bool) or weight not in (0, 1):
        raise MessageProblem(field, f"must be 0 or 1, got {weight!r}.")
    if weight == 0:
        raise MessageProblem(field, "is 0, which this server cannot honour: it trains on every assistant message. "
                                    "Remove the message (or the conversation after it) not to train on it.")


def _info(row: StoredFile) -> FileInfo:
    return FileInfo(id=row.id, user_id=row.user_id, filename=row.filename, purpose=row.purpose, bytes=row.bytes,
                    rows=row.rows, kind=row.kind, created_at=row.created_at)
