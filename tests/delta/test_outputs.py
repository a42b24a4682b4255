"""Delta files and model folders are written like every Gym output: never over existing work unless asked
(--overwrite), and what a killed `gym delta compress` left behind is removed by the next one."""

from __future__ import annotations

import json
import subprocess
import sys

from gym.cli import main


def test_compress_replaces_an_existing_file_only_with_overwrite(gaussian_finetune, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "d.safetensors"
    out.write_bytes(b"an older delta")
    args = ["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
            "--method", "int8", "-o", str(out)]
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    assert out.read_bytes() == b"an older delta"
    assert main([*args, "--overwrite"]) == 0
    assert main(["delta", "inspect", str(out)]) == 0 and "int8 delta" in capsys.readouterr().out


def test_what_a_killed_compress_left_is_removed_by_the_next(gaussian_finetune, tiny_model_dir, tmp_path):
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    leftover = tmp_path / f".d.safetensors.tmp-{dead}"
    leftover.write_bytes(b"\0" * 4096)  # a kill -9 in the middle of the write
    assert main(["delta", "compress", "--base", str(tiny_model_dir), "--finetuned", str(gaussian_finetune),
                 "--method", "int8", "-o", str(tmp_path / "d.safetensors")]) == 0
    assert not leftover.exists() and (tmp_path / "d.safetensors").is_file()
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_soup_aggregate_replaces_a_model_folder_only_with_overwrite(gaussian_finetune, tiny_model_dir, tmp_path,
                                                                    capsys):
    soup, out = tmp_path / "soup", tmp_path / "soup-model"
    assert main(["soup", "init", str(soup), "--base", str(tiny_model_dir), "method=mean", "min_contributors=1"]) == 0
    assert main(["soup", "contribute", str(soup), str(gaussian_finetune), "--user", "a"]) == 0
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"a finished model")
    assert main(["soup", "aggregate", str(soup), "-o", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == b"a finished model"
    assert main(["soup", "status", str(soup), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["privacy"]["per_round"] == []  # no round was closed
    # Not a folder Gym wrote (no manifest lists model.safetensors): --overwrite leaves it alone too.
    assert main(["soup", "aggregate", str(soup), "-o", str(out), "--overwrite"]) == 2
    assert "is not a folder Gym wrote" in capsys.readouterr().err
    assert (out / "model.safetensors").read_bytes() == b"a finished model"
    (out / "gym_manifest.json").write_text(json.dumps({"what": "model", "files": ["model.safetensors"]}))
    assert main(["soup", "aggregate", str(soup), "-o", str(out), "--overwrite"]) == 0  # a Gym output: replaced
    assert json.loads((out / "gym_manifest.json").read_text())["made_by"] == "gym soup aggregate"
