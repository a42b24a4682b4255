"""Read rows from json / jsonl / csv / parquet / arrow / txt files, keeping each row's position for error messages.

A .txt file is read as LLaMA-Factory reads it (its `wiki_demo.txt`, through datasets' "text" builder):
one row per line, the line in a column named `text`.
"""

from __future__ import annotations

import codecs
import csv
import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym.core.errors import DataError

EXTENSIONS = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".txt")


@dataclass(frozen=True)
class RowSource:
    """Where a row came from: `file.jsonl, line 12` or `file.json, row 3`."""

    file: str
    index: int  # 1-based
    unit: str = "row"

    def __str__(self) -> str:
        return f"{self.file}, {self.unit} {self.index}"


def _files(path: Path) -> list[Path]:
    if not path.exists() and glob.has_magic(str(path)):  # `file_name: shards/*.jsonl`: the matches, in name order
        files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).suffix in EXTENSIONS and Path(p).is_file())
        if not files:
            raise DataError(f"{path} matches no {'/'.join(EXTENSIONS)} files.")
        return files
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in EXTENSIONS)
        if not files:
            raise DataError(f"{path} is a folder with no {'/'.join(EXTENSIONS)} files.")
        if any(p.suffix == ".arrow" for p in files):
            # A folder `Dataset.save_to_disk` wrote: its dataset_info.json and state.json describe the rows, in the
            # .arrow shards.
            return [p for p in files if p.suffix == ".arrow"]
        # A folder of .txt files is a text corpus; a README.txt or notes.txt beside json/csv/parquet rows is
        # not data (and was never read before .txt was supported), so it stays unread there.
        structured = [p for p in files if p.suffix != ".txt"]
        return structured or files
    if not path.is_file():
        raise DataError(f"Dataset file not found: {path}")
    if path.suffix not in EXTENSIONS:
        raise DataError(f"{path}: unsupported file type '{path.suffix}'; use {', '.join(EXTENSIONS)}.")
    return [path]


# Longest first: UTF-32-LE's mark begins with UTF-16-LE's.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))


def text_encoding(file: Path) -> str:
    """UTF-8, with or without the byte-order mark Windows editors and Excel's "CSV UTF-8" write first (read as
    plain UTF-8 it becomes part of the first key or line: `\ufeffinstruction`), or UTF-16/32 when a mark says so
    (Notepad's "Unicode", PowerShell's default)."""
    with file.open("rb") as handle:
        head = handle.read(4)
    return next((name for bom, name in _BOMS if head.startswith(bom)), "utf-8-sig")


def read_rows(path: str | Path) -> Iterator[tuple[RowSource, Any]]:
    for file in _files(Path(path)):
        try:
            yield from _READERS[file.suffix](file)
        except UnicodeDecodeError:  # the name says .json/.jsonl/.csv/.txt, the bytes say otherwise
            raise DataError(f"{file}: not UTF-8 text, so not a {file.suffix} dataset (a binary file, or text in "
                            "another encoding without a byte-order mark: save it as UTF-8).") from None
        except csv.Error as exc:  # a NUL byte, a field over the size limit
            raise DataError(f"{file}: not a readable CSV file ({exc}).") from None


def first_row(path: str | Path) -> dict[str, Any] | None:
    for _, row in read_rows(path):
        return row if isinstance(row, dict) else None
    return None


def _read_json(file: Path) -> Iterator[tuple[RowSource, Any]]:
    text = file.read_text(encoding=text_encoding(file))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # `datasets` accepts JSON lines in a .json file; so do we.
        if exc.msg.startswith("Extra data"):
            yield from _read_jsonl(file)
            return
        raise DataError(f"{file}: not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{file}: expected a JSON array of objects, got {type(data).__name__}.")
    for i, row in enumerate(data, start=1):
        yield RowSource(str(file), i), row


def _read_jsonl(file: Path) -> Iterator[tuple[RowSource, Any]]:
    with file.open(encoding=text_encoding(file)) as handle:
        read_any = False
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))  # with its newline, a cut-off row errs at "line 2, column 1"
            except json.JSONDecodeError as exc:
                if not read_any and line.lstrip().startswith("["):
                    # A JSON array under a .jsonl name (a pretty-printed export): `datasets` reads it, so do we.
                    yield from _json_array_rows(file, lineno, exc)
                    return
                raise DataError(f"{file}, line {lineno}: not valid JSON (column {exc.colno}): {exc.msg}") from None
            read_any = True
            yield RowSource(str(file), lineno, "line"), row


def _json_array_rows(file: Path, lineno: int, error: json.JSONDecodeError) -> Iterator[tuple[RowSource, Any]]:
    try:
        data = json.loads(file.read_text(encoding=text_encoding(file)))
    except json.JSONDecodeError:
        raise DataError(f"{file}, line {lineno}: not valid JSON (column {error.colno}): {error.msg}") from None
    if not isinstance(data, list):
        raise DataError(f"{file}: expected JSON lines or a JSON array of objects, got {type(data).__name__}.")
    for i, row in enumerate(data, start=1):
        yield RowSource(str(file), i), row


def _read_csv(file: Path) -> Iterator[tuple[RowSource, Any]]:
    with file.open(encoding=text_encoding(file), newline="") as handle:
        for i, row in enumerate(csv.DictReader(handle), start=1):
            yield RowSource(str(file), i), row


def _read_parquet(file: Path) -> Iterator[tuple[RowSource, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except Exception as exc:  # pyarrow raises several types for broken files
        raise DataError(f"{file}: not a readable parquet file: {exc}") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield RowSource(str(file), i), row


def _read_arrow(file: Path) -> Iterator[tuple[RowSource, Any]]:
    """An Arrow file as `datasets` writes it (a stream: save_to_disk's shards, its cache files) or as pyarrow's
    file format (Feather v2)."""
    import pyarrow as pa

    try:
        try:
            table = pa.ipc.open_stream(pa.memory_map(str(file))).read_all()
        except pa.ArrowInvalid:
            table = pa.ipc.open_file(pa.memory_map(str(file))).read_all()
    except Exception as exc:  # pyarrow raises several types for broken files
        raise DataError(f"{file}: not a readable Arrow file: {exc}") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield RowSource(str(file), i), row


def _read_text(file: Path) -> Iterator[tuple[RowSource, Any]]:
    # Lines are split as datasets' "text" builder splits them: universal newlines (\n, \r\n, \r), the line
    # break dropped, the rest of the line kept as it is. That builder also keeps blank lines, which
    # LLaMA-Factory then trains on as a lone EOS; Gym skips them, as its .jsonl reader does, since a pt row
    # must hold text (gym.data.formats refuses an empty one) and a blank line between paragraphs is not a
    # document.
    with file.open(encoding=text_encoding(file)) as handle:
        for lineno, line in enumerate(handle, start=1):
            text = line.rstrip("\n")
            if text.strip():
                yield RowSource(str(file), lineno, "line"), {"text": text}


_READERS = {".json": _read_json, ".jsonl": _read_jsonl, ".csv": _read_csv, ".parquet": _read_parquet,
            ".arrow": _read_arrow, ".txt": _read_text}
