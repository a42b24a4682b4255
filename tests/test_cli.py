from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from tests.gym_cli import assert_one_line_error, gym_here, gym_process

from gym.cli import USAGE, main


@pytest.mark.parametrize(
    ("args", "message"),
    [(["lora_rnak=8"], "Did you mean 'lora_rank'"), (["lora_rank=eight"], "expects an integer"),
     (["dataset=nope_dataset"], "Dataset 'nope_dataset' not found")],
)
def test_bad_input_exits_2_with_one_readable_message(tmp_path, train_config, args, message, capfd):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(train_config()))
    # The dataset is found missing only once the training stack is loaded: that case runs in this process, as a
    # process of its own would spend seconds importing it (the other two and a hostile-image test are processes).
    in_process = args[0].startswith("dataset=")
    done = gym_here("train", cfg, *args, capfd=capfd) if in_process else gym_process("train", cfg, *args)
    assert_one_line_error(done, message)


def test_malformed_row_exits_2_and_writes_nothing(tmp_path, train_config, capfd):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": 3}\n')
    cfg = tmp_path / "c.yaml"
    out = tmp_path / "never"
    cfg.write_text(yaml.safe_dump(train_config(dataset=str(bad), output_dir=str(out))))
    assert_one_line_error(gym_here("train", cfg, capfd=capfd), f"{bad}, line 2: field 'output' must be a string")
    assert not out.exists()


def test_debug_shows_the_traceback(tmp_path, train_config):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(train_config()))
    proc = gym_process("train", cfg, "lora_rnak=8", "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_train_then_chat_answers_once(tmp_path, train_config):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(train_config(max_new_tokens=5, do_sample=False)))
    proc = gym_process("train", cfg)
    assert proc.returncode == 0, proc.stderr
    assert "Done: 3 steps" in proc.stdout and "Saved to" in proc.stdout
    chat = gym_process("chat", cfg, "--prompt", "Add 2 and 3.")
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.startswith("User: Add 2 and 3.\nAssistant:")
    # The run's folder names the same model (its adapter on the base adapter_config.json names): the same answer.
    by_folder = gym_process("chat", tmp_path / "out", "--prompt", "Add 2 and 3.", "max_new_tokens=5", "do_sample=false")
    assert by_folder.returncode == 0, by_folder.stderr
    assert by_folder.stdout == chat.stdout


def test_chat_prompt_prints_the_answer_on_stdout_and_status_before_it(tiny_model_dir):
    """stdout is the exchange alone; the engine's status lines go to stderr, and all of them come before the
    exchange (a terminal shows both streams, and they used to land inside the answer line)."""
    args = ("chat", "--model_name_or_path", str(tiny_model_dir), "--prompt", "Add 2 and 3.", "max_new_tokens=5",
            "do_sample=false")
    chat = gym_process(*args)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout.startswith("User: Add 2 and 3.\nAssistant: ") and "[gym]" not in chat.stdout
    assert "[gym] Fast engine ready" in chat.stderr
    both = subprocess.run([sys.executable, "-m", "gym.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300).stdout
    assert both.index("[gym] Fast engine ready") < both.index("User: ")
    assert both[both.index("User: "):] == chat.stdout  # nothing else after the exchange starts


def test_version_env_and_help(capsys):
    from gym import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    for name in ("python", "torch", "transformers", "peft", "trl", "accelerate", "device"):
        assert name in text
    assert main(["train", "--help"]) == 0
    assert "lora_rank (an integer, default 8)" in capsys.readouterr().out
    assert main(["trian"]) == 2
    assert "Did you mean 'train'" in capsys.readouterr().err


def test_soup_and_api_verbs_are_wired(capsys, tmp_path):
    assert main(["soup", "status", str(tmp_path / "nowhere")]) == 2
    assert "is not a soup" in capsys.readouterr().err
    assert "soup init|contribute|status|aggregate|rewards" in USAGE and "api [CONFIG]" in USAGE
