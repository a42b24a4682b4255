"""`gym webui`'s own arguments: refusals exit 2 with one line. Listening beyond this machine without --auth is refused
unless --insecure-no-auth is given, which warns once (tests/webui/test_hostile_webui.py)."""

from __future__ import annotations

import pytest

from gym.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--share", "on"], "share links"), (["--share"], "share links"), (["--share", "--port", "7861"], "share links"),
    (["--auth", "nopassword"], "user:password"), (["--port", "x"], "whole number"),
    (["--prot", "1"], "unknown argument"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert main(["webui", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

