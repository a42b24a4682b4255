"""Result files of `gym eval`: the table on stdout, the JSON on disk, and `--compare A B` with a significance test.

A result file holds the eval settings, the model (what was loaded and its weight fingerprint), the seed,
the library versions and, per task, its metrics (and with --log_samples every item's prediction). Two
files compare task by task: where both logged the same items, the test is paired (McNemar's test for
right/wrong items, exact below 25 discordant items and chi-square above; a paired z-test otherwise); without
samples, an unpaired z-test from the standard errors.
"""

from __future__ import annotations

import json
import math
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from gym.core.errors import ConfigError, OutputError
from gym.core.files import temp_path
from gym.core.stats import EXACT_BELOW, _binomial_two_sided, mcnemar  # noqa: F401 (one McNemar for eval and the gates)

PACKAGES = ("torch", "transformers", "peft", "datasets", "lm_eval")


def versions() -> dict[str, str | None]:
    from gym.core.version import __version__

    found: dict[str, str | None] = {"gym": __version__}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def write_report(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _unwritable(path, exc) from exc
    return path


def check_writable(path: str | os.PathLike[str]) -> None:
    """Whether the report can be written at `path`, tried before any work: a folder that cannot be made or written
    failed only once every task had run, and the scores were lost with the traceback."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.touch()
        tmp.unlink()
    except OSError as exc:
        raise _unwritable(path, exc) from exc


def _unwritable(path: Path, exc: OSError) -> OutputError:
    return OutputError(f"Cannot write the results to {path}: {exc.strerror or exc} ({exc.filename or path.parent}). "
                       "Choose a writable location.")


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A result file as `--compare` reads it; a ConfigError naming the file (and task and field) for anything
    else: result files are handed around and edited, so what they hold is checked before it is used."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such result file (write one with `gym eval ... -o {path}`).") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder; give a result file (written by `gym eval ... -o FILE`).") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a gym eval result file: not JSON (line {exc.lineno}).") from None
    except ValueError:  # not UTF-8 (a binary file), or a number of more digits than Python reads
        raise ConfigError(f"{path} is not a gym eval result file: not JSON text.") from None
    if not isinstance(report, dict) or "results" not in report:
        raise ConfigError(f"{path} is not a gym eval result file: it has no 'results'.")
    if not isinstance(report["results"], dict):
        raise ConfigError(f"{path}, results: expected an object of {{task: result}}, got "
                          f"{type(report['results']).__name__}.")
    for task, result in report["results"].items():
        _check_result(f"{path}, results.{task}", result)
    return report


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_result(where: str, result: Any) -> None:
    """What compare reads of one task's result: metrics (numbers; standard errors numbers or null) and samples
    (one object per item)."""
    if not isinstance(result, dict) or not isinstance(result.get("metrics"), dict):
        raise ConfigError(f"{where}: expected an object with 'metrics' {{name: number}}, got "
                          f"{_kind(result if not isinstance(result, dict) else result.get('metrics'))}.")
    for name, value in result["metrics"].items():
        if str(name).endswith("_stderr") and value is not None and not _is_number(value):
            raise ConfigError(f"{where}.metrics.{name}: a standard error is a number or null, got {value!r}.")
    samples = result.get("samples")
    if samples is None:
        return
    if not isinstance(samples, list):
        raise ConfigError(f"{where}.samples: expected a list (one object per item), got {_kind(samples)}.")
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise ConfigError(f"{where}.samples[{i}]: expected an object (one item's scores), got {_kind(sample)}.")


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:40]}"


def _value(value: float, stderr: float | None) -> str:
    text = f"{value:.4f}"
    return text + (f" ± {stderr:.4f}" if stderr is not None and not math.isnan(stderr) else "")


def _items_of(result: dict[str, Any], metric: str) -> Any:
    """How many items `metric` was computed over: its own count where a task's metrics cover different items
    (`metric_items`: safety's harmful vs benign requests, tool calling's call vs text turns), else the task's."""
    return (result.get("metric_items") or {}).get(metric, result.get("items")) or ""


def _aligned(rows: list[list[str]], right: set[int]) -> list[str]:
    """Rows of cells in columns as wide as their widest cell (right-aligned where `right` says), the last free."""
    widths = [max(len(row[i]) for row in rows if i < len(row)) for i in range(max(len(row) for row in rows))]
    lines = []
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append(("  ".join([*cells, row[-1]])).rstrip())
    return lines


def format_table(results: dict[str, Any]) -> str:
    rows = [["task", "metric", "value", "items", "prompt"]]
    for task, result in results.items():
        metrics = result.get("metrics", {})
        for metric, value in metrics.items():
            if metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{metric}_stderr")
            prompt = result.get("prompt", "")
            if result.get("n_shot") is not None and prompt:
                prompt += f", {result['n_shot']}-shot"
            rows.append([task, metric, _value(value, stderr), str(_items_of(result, metric)), prompt])
        for subject, row in (result.get("subjects") or {}).items():
            rows.append([f"  {subject}", "acc", _value(row["acc"], row.get("acc_stderr")), str(row["items"]), ""])
        if "tokens" in result:
            rows.append(["  tokens scored", "", "", str(result["tokens"]), ""])
    return "\n".join(_aligned(rows, right={2, 3}))


# ---------------------------------------------------------------- comparing two result files

def _normal_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def _per_item(result: dict[str, Any], metric: str) -> dict[str, float] | None:
    samples = result.get("samples")
    if not samples:
        return None
    out = {}
    for i, sample in enumerate(samples):
        key = str(sample.get("source") or sample.get("row") or sample.get("doc_id") or i)
        if _is_number(sample.get(metric)):
            out[key] = float(sample[metric])
        elif metric == "loss" and _is_number(sample.get("nll")) and _is_number(sample.get("tokens")) \
                and sample["tokens"] > 0:
            out[key] = sample["nll"] / sample["tokens"]
    return out or None


def significance(a: dict[str, Any], b: dict[str, Any], metric: str) -> tuple[float | None, str]:
    """(p-value, the test's name) for metric between two task results."""
    items_a, items_b = _per_item(a, metric), _per_item(b, metric)
    if items_a and items_b and set(items_a) == set(items_b):
        keys = sorted(items_a)
        xs, ys = [items_a[k] for k in keys], [items_b[k] for k in keys]
        if all(v in (0.0, 1.0) for v in xs + ys):
            only_a = sum(1 for x, y in zip(xs, ys) if x > y)
            only_b = sum(1 for x, y in zip(xs, ys) if y > x)
            return mcnemar(only_a, only_b)
        diffs = [y - x for x, y in zip(xs, ys)]
        n = len(diffs)
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
        if sd == 0:
            return (1.0 if mean == 0 else 0.0), "paired z"
        return _normal_p(mean / (sd / math.sqrt(n))), "paired z"
    se_a, se_b = a["metrics"].get(f"{metric}_stderr"), b["metrics"].get(f"{metric}_stderr")
    if se_a is None or se_b is None or math.isnan(se_a) or math.isnan(se_b) or se_a + se_b == 0:
        return None, "none (no samples or standard errors)"
    return _normal_p((b["metrics"][metric] - a["metrics"][metric]) / math.sqrt(se_a ** 2 + se_b ** 2)), "z"


def compare(path_a: str, path_b: str) -> str:
    a, b = read_report(path_a), read_report(path_b)
    shared = [t for t in a["results"] if t in b["results"]]
    if not shared:
        raise ConfigError(f"{path_a} and {path_b} have no task in common "
                          f"({', '.join(a['results'])} vs {', '.join(b['results'])}).")
    rows = [["task", "metric", "A", "B", "B - A", "p", "test"]]
    starred = False
    for task in shared:
        ra, rb = a["results"][task], b["results"][task]
        for metric, value_a in ra.get("metrics", {}).items():
            value_b = rb.get("metrics", {}).get(metric)
            if metric.endswith("_stderr") or not isinstance(value_a, (int, float)) or \
                    not isinstance(value_b, (int, float)):
                continue
            p, test = significance(ra, rb, metric)
            mark = " *" if p is not None and p < 0.05 else ""
            starred = starred or bool(mark)
            rows.append([task, metric, f"{value_a:.4f}", f"{value_b:.4f}", f"{value_b - value_a:+.4f}",
                         "-" if p is None else f"{p:.4f}", test + mark])
    lines = [f"A = {path_a}", f"B = {path_b}", "", *_aligned(rows, right={2, 3, 4, 5})]
    if starred:
        lines.append("\n* p < 0.05: the difference is unlikely to be chance on these items.")
    return "\n".join(lines)
