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



@pytest.mark.slow
def test_the_page_says_its_address_once_and_never_offers_a_share_link(tmp_path):
    # Gradio's own start-up lines end with "set `share=True` in `launch()`", which `gym webui` refuses.
    import os
    import subprocess
    import sys

    from gym.workflows.launch import free_port

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "gym.cli", "webui", "--port", str(port),
                               "--runs_dir", str(tmp_path / "runs")], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
    finally:
        server.terminate()
        rest, _ = server.communicate(timeout=60)
    assert first.strip() == f"Gym web UI on http://127.0.0.1:{port}/ (Ctrl-C stops it).", first + rest
    assert "share" not in first + rest
