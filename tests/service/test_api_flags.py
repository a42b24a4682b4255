"""`gym api`'s service flags fail as one line and exit 2 before the model loads: --db without --variants, a database
URL Gym cannot use, limits that are not positive whole numbers."""

from __future__ import annotations

import pytest
from tests.service.conftest import free_port

import gym.serve.server as server
from gym.cli import main


@pytest.fixture()
def no_model_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(server, "ChatModel", refuse)


@pytest.mark.parametrize("extra, message", [
    (["--db", "postgresql://h/db"], "give --variants STORE too"),
    (["--variants", "{store}", "--db", "mysql://h/db"], "mysql is not supported"),
    (["--variants", "{store}", "--max_file_bytes", "0"], "at least 1"),
    (["--variants", "{store}", "--file_quota_bytes", "lots"], "whole numbers"),
])
def test_bad_service_flags_are_one_line_and_exit_2(tmp_path, tiny_model_dir, capsys, no_model_load, extra, message):
    (tmp_path / "store").mkdir()
    argv = ["api", "--model_name_or_path", str(tiny_model_dir), "--port", str(free_port()),
            *[a.format(store=tmp_path / "store") for a in extra]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err, err
