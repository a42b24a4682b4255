"""`gym webui`'s own arguments: refusals exit 2 with one line; listening beyond this machine without --auth warns."""

from __future__ import annotations

import socket

import pytest

from gym.cli import main


@pytest.mark.parametrize("argv, message", [
    (["--share", "on"], "share links"), (["--auth", "nopassword"], "user:password"), (["--port", "x"], "whole number"),
    (["--prot", "1"], "unknown argument"),
])
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert main(["webui", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_listening_on_every_interface_without_auth_warns(tmp_path):
    from gym.webui.app import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.warns(UserWarning, match="without --auth"):
        demo, url = serve(host="0.0.0.0", port=port, runs_dir=str(tmp_path / "runs"), block=False)
    demo.close()
    assert str(port) in url
