"""`gym tfgrpo train|eval` from YAML against an OpenAI-compatible endpoint (a scripted one: exact and offline)."""

from __future__ import annotations

import json

import yaml

from gym.cli import main
from gym.tfgrpo.library import ExperienceLibrary

from .conftest import ScriptedLLM


def _config(tmp_path, base_url, **overrides):
    data = [{"question": f"mix {i}", "answer": "1"} for i in range(6)] + [{"question": "easy", "answer": "1"}]
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "queries.json").write_text(json.dumps(data))
    config = {"model": "scripted", "base_url": base_url, "api_key": "secret-key", "dataset": "data/queries.json",
              "val_size": 2, "reward_funcs": "accuracy", "group_size": 4, "max_epochs": 1, "batch_size": 3,
              "eval_samples": 4, "retry_delay": 0.0, "output_dir": str(tmp_path / "run"),
              "prices": {"rollout": [0.1, 0.2], "updater": [1.0, 2.0]}, **overrides}
    path = tmp_path / "tfgrpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_train_then_eval_through_an_endpoint(tmp_path, fake_openai, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = fake_openai(ScriptedLLM())
    config = _config(tmp_path, server.base_url)
    assert main(["tfgrpo", "train", str(config)]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run"
    library = ExperienceLibrary.load(run / "experiences.json")
    assert len(library) >= 1 and library.step == 2  # 5 training queries in batches of 3
    assert "[0]. When solving mix" in out and "2 queries held out" in out
    assert "batch_update" in out and "cost $" in out
    saved = yaml.safe_load((run / "gym_config.yaml").read_text())
    assert "api_key" not in saved and saved["group_size"] == 4  # the key is never written down
    usage = json.loads((run / "usage.json").read_text())
    assert usage["roles"]["rollout"]["calls"] == 5 * 4

    requests = server.requests
    assert main(["tfgrpo", "train", str(config)]) == 0  # finished: resumes to the same library, no calls
    assert server.requests == requests
    assert ExperienceLibrary.load(run / "experiences.json") == library

    assert main(["tfgrpo", "eval", str(config)]) == 0
    out = capsys.readouterr().out
    assert "Mean@4" in out and "baseline" in out and "with experiences" in out
    results = json.loads((run / "eval_results.json").read_text())
    assert results["baseline"]["queries"] == 2 and results["library"]["size"] == len(library)
    assert main(["tfgrpo", "eval", str(config), "--experiences", "none"]) == 0
    assert "with experiences" not in capsys.readouterr().out


def test_config_mistakes_exit_2_with_one_line(tmp_path, fake_openai, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = _config(tmp_path, "http://127.0.0.1:9/v1", group_sise=3)
    assert main(["tfgrpo", "train", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Unknown tfgrpo key 'group_sise'. Did you mean 'group_size'?" in err and "Traceback" not in err
    config = _config(tmp_path, "http://127.0.0.1:9/v1", temperature_train=3)
    assert main(["tfgrpo", "train", str(config)]) == 2
    assert "'temperature_train' must be in [0, 2]" in capsys.readouterr().err
    config = _config(tmp_path, "http://127.0.0.1:9/v1", max_retries=0)
    assert main(["tfgrpo", "train", str(config)]) == 2
    assert "failed 1 times; last: APIConnectionError" in capsys.readouterr().err
    config = _config(tmp_path, "http://127.0.0.1:9/v1", val_size=0)
    assert main(["tfgrpo", "eval", str(config)]) == 2
    assert "Nothing to evaluate on" in capsys.readouterr().err
    assert main(["tfgrpo", "fit"]) == 2
