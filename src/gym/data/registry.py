"""Where datasets come from: LLaMA-Factory's `dataset_info.json`, plain file paths, or the hub.

A `dataset_info.json` entry looks like
    "alpaca_en_demo": {"file_name": "alpaca_en_demo.json"}
    "chat_demo": {"file_name": "chat.json", "formatting": "sharegpt",
                  "columns": {"messages": "conversations"},
                  "tags": {"role_tag": "from", "content_tag": "value"}}
and is read as it is in LLaMA-Factory, so its users bring their datasets unchanged.
"""

from __future__ import annotations

import difflib
import glob
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gym.core.errors import DataError
from gym.core.names import did_you_mean, split_names
from gym.data.readers import EXTENSIONS, first_row, text_encoding

logger = logging.getLogger(__name__)

ALPACA_COLUMNS = {
    "prompt": "instruction", "query": "input", "response": "output", "history": None, "system": None,
    "chosen": None, "rejected": None, "kto_tag": None, "answer": None, "label": "label",
}
SHAREGPT_COLUMNS = {"messages": "conversations", "system": None, "tools": None, "chosen": None, "rejected": None,
                    "kto_tag": None, "answer": None, "label": "label"}
SHAREGPT_TAGS = {
    "role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt",
    "observation_tag": "observation", "function_tag": "function_call", "system_tag": "system",
}
# Multiple-choice evaluation data (gym.eval.mc): MMLU's layout, question + choices + answer (+ subject).
EVAL_COLUMNS = ("question", "choices", "subject")
OPENAI_TAGS = {
    "role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant",
    "observation_tag": "tool", "function_tag": "function_call", "system_tag": "system",
}


@dataclass
class DatasetAttr:
    """One dataset: where its rows are, and how to read them."""

    name: str
    load_from: Literal["file", "hub"]
    path: str  # a file or folder for "file", a hub id for "hub"
    formatting: Literal["alpaca", "sharegpt", "openai"] = "alpaca"
    ranking: bool = False
    split: str = "train"
    subset: str | None = None
    num_samples: int | None = None
    columns: dict[str, str | None] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    media_dir: str | None = None  # where relative image/video/audio paths are looked up first
    mapped: dict[str, str] = field(default_factory=dict)  # columns named by the user, not the usual names

    def column(self, key: str) -> str | None:
        return self.columns.get(key)

    def tag(self, key: str) -> str:
        return self.tags[key]


# What a dataset_info.json entry may say (LLaMA-Factory's keys); anything else is most likely a typo.
ENTRY_KEYS = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name", "formatting",
              "ranking", "subset", "split", "folder", "num_samples", "columns", "tags")


def _check_keys(where: str, given: Any, known: Any) -> None:
    if not isinstance(given, dict):
        raise DataError(f"dataset_info.json: {where} must be an object, got {type(given).__name__}.")
    for key in given:
        if key not in known:
            hint = f" Known: {', '.join(sorted(known))}."
            raise DataError(f"dataset_info.json: unknown key '{key}' in {where}.{did_you_mean(key, known, hint)}")


MEDIA_COLUMNS = ("images", "videos", "audios")  # gym.data.media reads and checks them


def _attr_from_info(name: str, info: dict[str, Any], dataset_dir: Path) -> DatasetAttr:
    _check_keys(f"entry '{name}'", info, ENTRY_KEYS)
    _check_keys(f"'{name}'.columns", info.get("columns", {}),
                [*ALPACA_COLUMNS, *SHAREGPT_COLUMNS, "messages", *EVAL_COLUMNS, *MEDIA_COLUMNS])
    _check_keys(f"'{name}'.tags", info.get("tags", {}), SHAREGPT_TAGS)
    for key in ("file_name", "hf_hub_url", "split", "subset", "folder"):
        if key in info and not (isinstance(info[key], str) and info[key].strip()):
            raise DataError(f"dataset_info.json: '{name}'.{key} must be a non-empty string, got {info[key]!r}.")
    for where, may_be_null in (("columns", True), ("tags", False)):
        values: dict[str, Any] = info.get(where, {})
        for key, value in values.items():
            if not (isinstance(value, str) and value.strip()) and not (may_be_null and value is None):
                # a number or null here was read as a column or role literally named so, and missed in every row
                what = "a column's name (a string), or null for none" if may_be_null else "a non-empty string"
                raise DataError(f"dataset_info.json: '{name}'.{where}.{key} must be {what}, got {value!r}.")
    formatting = info.get("formatting", "alpaca")
    ranking = info.get("ranking", False)
    if not isinstance(ranking, bool):  # "false" in quotes is a non-empty string, true to Python
        raise DataError(f"dataset_info.json: '{name}'.ranking must be true or false (without quotes), "
                        f"got {ranking!r}.")
    num_samples = info.get("num_samples")
    if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                    or num_samples < 1):
        raise DataError(f"dataset_info.json: '{name}'.num_samples must be a whole number of at least 1, "
                        f"got {num_samples!r}.")
    if formatting not in ("alpaca", "sharegpt", "openai"):
        raise DataError(f"dataset_info.json: '{name}'.formatting must be alpaca, sharegpt or openai, "
                        f"got {formatting!r}.")
    load_from: Literal["file", "hub"]
    if "file_name" in info:
        load_from, path = "file", str(dataset_dir / info["file_name"])
    elif "hf_hub_url" in info:
        load_from, path = "hub", info["hf_hub_url"]
    else:
        raise DataError(f"dataset_info.json: '{name}' needs 'file_name' or 'hf_hub_url' "
                        "(ms_hub_url, om_hub_url and script_url are not supported).")
    if load_from == "file":
        _check_local_split(name, info)
    columns = dict(ALPACA_COLUMNS if formatting == "alpaca" else SHAREGPT_COLUMNS)
    if formatting == "openai":
        # OpenAI/TRL rows keep their functions in `tools`; a row without the column simply offers none
        columns["messages"], columns["tools"] = "messages", "tools"
    # A column given its usual name (`query: input`, `images: images`) may be absent from every row, as in entries
    # copied from LLaMA-Factory's; a name of the user's own must be in some row (gym.data.loader checks).
    mapped = {key: column for key, column in info.get("columns", {}).items()
              if isinstance(column, str) and column not in (key, columns.get(key))}
    columns.update(info.get("columns", {}))
    tags = dict(OPENAI_TAGS if formatting == "openai" else SHAREGPT_TAGS)
    tags.update(info.get("tags", {}))
    return DatasetAttr(
        name=name, load_from=load_from, path=path, formatting=formatting, ranking=ranking,
        split=info.get("split", "train"), subset=info.get("subset"), num_samples=num_samples,
        columns=columns, tags=tags, mapped=mapped,
    )


def _check_local_split(name: str, info: dict[str, Any]) -> None:
    """`split` and `subset` choose within a hub dataset; a local file is read whole. LLaMA-Factory loads a file with
    datasets' json/csv/... builders, whose one split is "train": any other split fails there, and a subset is never
    passed to them. Reading every row instead would train on the rows the entry meant to leave out."""
    split = info.get("split", "train")
    if split.startswith("train["):
        raise DataError(f"dataset_info.json: '{name}'.split is {split!r}: slicing a local file's rows is not "
                        "supported; remove 'split', and keep fewer rows with num_samples (a random draw) or "
                        "max_samples (the first rows).")
    if split != "train":
        raise DataError(f"dataset_info.json: '{name}'.split is {split!r}, but a local file (file_name) has only the "
                        "train split; remove 'split', or put those rows in a file of their own (for evaluation: "
                        "eval_dataset).")
    if "subset" in info:
        logger.warning("dataset_info.json: '%s'.subset (%r) has no effect on a local file, which is read whole "
                       "(LLaMA-Factory ignores it there too); remove it, or point file_name at that subset's file.",
                       name, info["subset"])


def read_dataset_info(dataset_dir: str | Path) -> dict[str, Any]:
    info_path = Path(dataset_dir) / "dataset_info.json"
    if not info_path.is_file():
        return {}
    try:
        info = json.loads(info_path.read_text(encoding=text_encoding(info_path)))
    except json.JSONDecodeError as exc:
        raise DataError(f"{info_path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from None
    if not isinstance(info, dict):
        raise DataError(f"{info_path} must hold a JSON object of dataset names.")
    return info


def get_dataset_attrs(names: str | list[str] | None, dataset_dir: str | Path,
                      media_dir: str | Path | None = None) -> list[DatasetAttr]:
    """`dataset: a,b` -> one DatasetAttr each, looked up in dataset_info.json, then as paths, then the hub.

    Relative media paths in the rows are looked up under `media_dir` (LLaMA-Factory's default: `dataset_dir`)."""
    if not names:
        return []
    if isinstance(names, str):
        names = split_names(names)
    dataset_dir = Path(dataset_dir)
    info = read_dataset_info(dataset_dir)
    attrs = []
    for name in names:
        if name in info:
            attrs.append(_attr_from_info(name, info[name], dataset_dir))
            continue
        path = Path(name).expanduser()
        for candidate in (path, dataset_dir / path):
            if (candidate.exists() and (candidate.is_dir() or candidate.suffix in EXTENSIONS)
                    or glob.has_magic(str(candidate)) and glob.glob(str(candidate))):
                attrs.append(_attr_from_file(name, candidate))
                break
        else:
            looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
            if looks_like_hub_id and Path(name).suffix not in EXTENSIONS:
                attrs.append(_attr_from_info(name, {"hf_hub_url": name}, dataset_dir))
                continue
            close = difflib.get_close_matches(name, list(info), n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            known = f" Known in {dataset_dir / 'dataset_info.json'}: {', '.join(sorted(info))}." if info else (
                f" No dataset_info.json in '{dataset_dir}'" + (" (the demo sets are in the repository's data/ folder: "
                "run from the repository root, or set dataset_dir to that folder)." if not dataset_dir.exists()
                                                               else "."))
            raise DataError(f"Dataset '{name}' not found: not in dataset_info.json, not a file.{hint}{known}")
    for attr in attrs:
        attr.media_dir = str(media_dir if media_dir is not None else dataset_dir)
    return attrs


def _attr_from_file(name: str, path: Path) -> DatasetAttr:
    """A bare file: sniff its first row to tell alpaca from sharegpt/openai."""
    row = first_row(path) or {}
    info: dict[str, Any] = {"file_name": str(path.resolve())}
    columns: dict[str, str] = {}
    if "messages" in row:
        info["formatting"] = "openai"
    elif "conversations" in row:
        info["formatting"] = "sharegpt"
        if "tools" in row:  # LLaMA-Factory's tool-calling rows (glaive_toolcall)
            columns["tools"] = "tools"
    elif "text" in row and "instruction" not in row:
        columns["prompt"] = "text"
    elif "prompt" in row and "instruction" not in row:  # TRL's layout: prompt (+ chosen/rejected, answer...)
        columns["prompt"] = "prompt"
    elif "instruction" in row and "history" in row:  # LLaMA-Factory's alpaca layout keeps earlier turns there
        columns["history"] = "history"
    if "system" in row and "messages" not in row:  # an OpenAI row's system prompt is its first message
        columns["system"] = "system"
    # The columns the alignment kinds read, under their usual names (TRL and LLaMA-Factory spellings).
    if "chosen" in row or "rejected" in row:  # one without the other is a pair with a field missing: said per row
        info["ranking"] = True
        columns.update(chosen="chosen", rejected="rejected")
    for tag_column in ("kto_tag", "label"):
        if isinstance(row.get(tag_column), bool):
            columns["kto_tag"] = tag_column
            break
    for media_column in MEDIA_COLUMNS:  # LLaMA-Factory's names; TRL's vision rows use `images` too
        if media_column in row:
            columns[media_column] = media_column
    for answer_column in ("answer", "solution"):
        if answer_column in row:
            columns["answer"] = answer_column
            break
    if columns:
        info["columns"] = columns
    return _attr_from_info(name, info, Path("/"))
