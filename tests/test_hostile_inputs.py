"""Every `gym` verb against hostile input: exit status 2, one line naming the problem, no traceback, and
nothing new (or changed) at the path the verb would have written. The verbs run in-process through
`gym.cli.main` (what the `gym` script calls), so an escaping exception would fail the test; a few run as
real processes too, to check the exit status and stderr as a shell sees them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from tests.gym_cli import gym_here, gym_process

from gym.core.files import human_bytes
from gym.delta.format import HEADER_KEY


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """A tiny base, a fine-tune, a good int8 delta of it, damaged copies, a pickle-only model, a finished
    soup round: what the hostile cases are made of."""
    root = tmp_path_factory.mktemp("hostile")
    from transformers import AutoModelForCausalLM

    tuned = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for name, param in tuned.named_parameters():
            if "mlp" in name:
                param.add_(0.01)
    tuned.save_pretrained(root / "tuned")
    good = root / "good.safetensors"
    assert gym_here("delta", "compress", "--base", tiny_model_dir, "--finetuned", root / "tuned", "--method",
                    "int8", "-o", good).returncode == 0

    tensors = load_file(str(good))
    from safetensors import safe_open

    with safe_open(str(good), "pt") as handle:
        metadata = handle.metadata()
    nan = {k: (torch.full_like(v, float("nan")) if k.endswith("::scale") else v) for k, v in tensors.items()}
    save_file(nan, str(root / "nan.safetensors"), metadata=metadata)
    short = {k: (v[: v.numel() // 2] if k.endswith("::codes") else v) for k, v in tensors.items()}
    save_file(short, str(root / "short.safetensors"), metadata=metadata)
    save_file(tensors, str(root / "list-header.safetensors"), metadata={HEADER_KEY: json.dumps([1, 2])})
    (root / "truncated.safetensors").write_bytes(good.read_bytes()[:200])
    (root / "huge-header.safetensors").write_bytes((10**12).to_bytes(8, "little") + b"{}")

    pickled = root / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not a real pickle")
    (root / "existing.safetensors").write_bytes(b"precious")
    (root / "existing-file").write_text("precious")
    (root / "existing-model").mkdir()
    (root / "existing-model" / "model.safetensors").write_bytes(b"precious")
    (root / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    data = root / "data"
    data.mkdir()
    (data / "rows.json").write_text(json.dumps([{"instruction": "a", "output": "b"}]))
    (data / "dataset_info.json").write_text(json.dumps({"rows": {"file_name": "rows.json", "formating": "alpaca"}}))
    config = root / "base.yaml"
    config.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_model_dir), "dataset": "rows",
                                      "dataset_dir": str(data), "output_dir": str(root / "never"), "max_steps": 1}))

    soup = root / "soup"
    assert gym_here("soup", "init", soup, "--base", tiny_model_dir, "method=mean",
                    "min_contributors=1").returncode == 0
    assert gym_here("soup", "contribute", soup, root / "tuned", "--user", "u").returncode == 0
    return {"root": root, "base": tiny_model_dir, "tuned": root / "tuned", "good": good, "config": config,
            "soup": soup, "data": data}


def _snapshot(path: Path) -> str:
    if not path.exists():
        return "absent"
    if path.is_file():
        return f"file {human_bytes(path.stat().st_size)} {hash(path.read_bytes())}"
    return "folder " + ",".join(sorted(f"{p.relative_to(path)}:{p.stat().st_size}" for p in path.rglob("*")))


Case = tuple[str, Callable[[dict[str, Path]], list[object]], str, Callable[[dict[str, Path]], Path]]
R = "root"
CASES: list[Case] = [
    ("train: a binary file as config", lambda w: ["train", w[R] / "binary.yaml"], "is not a text file",
     lambda w: w[R] / "never"),
    ("train: learning_rate=-1", lambda w: ["train", w["config"], "learning_rate=-1"], "'learning_rate' must be >= 0",
     lambda w: w[R] / "never"),
    ("train: batch size 0", lambda w: ["train", w["config"], "per_device_train_batch_size=0"],
     "'per_device_train_batch_size' must be at least 1", lambda w: w[R] / "never"),
    ("train: output_dir is a file", lambda w: ["train", w["config"], f"output_dir={w[R] / 'existing-file'}"],
     "is a file", lambda w: w[R] / "existing-file"),
    ("train: key=value ending in .json is an override", lambda w: ["train", w["config"], "dataset=/nowhere/x.json"],
     "Dataset '/nowhere/x.json' not found", lambda w: w[R] / "never"),
    ("train: a typo in dataset_info.json", lambda w: ["train", w["config"]], "Did you mean 'formatting'",
     lambda w: w[R] / "never"),
    ("chat: a model that is not there", lambda w: ["chat", "--model_name_or_path", w[R] / "nope", "--prompt", "hi"],
     "not found", lambda w: w[R] / "nope"),
    ("api: a port that is no number", lambda w: ["api", "--port", "eighty"], "take whole numbers",
     lambda w: w[R] / "nope"),
    ("infer: no such dataset", lambda w: ["infer", "--model_name_or_path", w["base"], "--dataset", "nope",
                                          "--dataset_dir", w["data"], "-o", w[R] / "preds.jsonl"],
     "Dataset 'nope' not found", lambda w: w[R] / "preds.jsonl"),
    ("delta compress: over an existing file", lambda w: ["delta", "compress", "--base", w["base"], "--finetuned",
                                                         w["tuned"], "--method", "int8", "-o",
                                                         w[R] / "existing.safetensors"],
     "already exists", lambda w: w[R] / "existing.safetensors"),
    ("delta compress: a pickle-only model", lambda w: ["delta", "compress", "--base", w["base"], "--finetuned",
                                                       w[R] / "pickled", "--method", "int8", "-o",
                                                       w[R] / "p.safetensors"],
     "never loaded", lambda w: w[R] / "p.safetensors"),
    ("delta compress: a truncated model file", lambda w: ["delta", "compress", "--base", w["base"], "--finetuned",
                                                          w[R] / "broken-model", "--method", "int8", "-o",
                                                          w[R] / "b.safetensors"],
     "broken-model", lambda w: w[R] / "b.safetensors"),
    ("delta apply: -o an existing file", lambda w: ["delta", "apply", "--base", w["base"], "--delta", w["good"], "-o",
                                                    w[R] / "existing-file"], "is a file",
     lambda w: w[R] / "existing-file"),
    ("delta apply: over an existing model", lambda w: ["delta", "apply", "--base", w["base"], "--delta", w["good"],
                                                       "-o", w[R] / "existing-model"], "already exists",
     lambda w: w[R] / "existing-model"),
    ("delta apply: a pickle-only base", lambda w: ["delta", "apply", "--base", w[R] / "pickled", "--delta",
                                                   w["good"], "-o", w[R] / "applied"], "never loaded",
     lambda w: w[R] / "applied"),
    ("delta apply: codes shorter than the shape", lambda w: ["delta", "apply", "--base", w["base"], "--delta",
                                                             w[R] / "short.safetensors", "-o", w[R] / "applied"],
     "bytes of codes", lambda w: w[R] / "applied"),
    ("delta inspect: NaN scales", lambda w: ["delta", "inspect", w[R] / "nan.safetensors"], "NaN or Inf",
     lambda w: w[R] / "nan.safetensors"),
    ("delta inspect: a header that is no object", lambda w: ["delta", "inspect", w[R] / "list-header.safetensors"],
     "not an object", lambda w: w[R] / "list-header.safetensors"),
    ("delta inspect: a truncated file", lambda w: ["delta", "inspect", w[R] / "truncated.safetensors"],
     "not a readable delta file", lambda w: w[R] / "truncated.safetensors"),
    ("delta inspect: a huge header length", lambda w: ["delta", "inspect", w[R] / "huge-header.safetensors"],
     "not a readable delta file", lambda w: w[R] / "huge-header.safetensors"),
    ("soup contribute: a pickle-only model", lambda w: ["soup", "contribute", w["soup"], w[R] / "pickled",
                                                        "--user", "mallory"], "never loaded", lambda w: w["soup"]),
    ("soup aggregate: over an existing model", lambda w: ["soup", "aggregate", w["soup"], "-o",
                                                          w[R] / "existing-model"], "already exists",
     lambda w: w[R] / "existing-model"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("title", "argv", "fragment", "final"), CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_writes_nothing(world, title, argv, fragment, final):
    if not (world[R] / "broken-model").exists():
        import shutil

        shutil.copytree(world["tuned"], world[R] / "broken-model")
        weights = world[R] / "broken-model" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    before = _snapshot(final(world))
    soup_before = gym_here("soup", "status", world["soup"], "--json").stdout
    proc = gym_here(*argv(world))
    assert proc.returncode == 2, f"{title}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gym: error:")]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert _snapshot(final(world)) == before, f"{title}: {final(world)} changed"
    assert gym_here("soup", "status", world["soup"], "--json").stdout == soup_before  # no round closed, no row added


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 10, 16])  # a train, a delta compress and a delta inspect case
def test_as_a_real_process_too(world, index):
    title, argv, fragment, final = CASES[index]
    proc = gym_process(*argv(world))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("gym: error:") == 1 and fragment in proc.stderr
