"""`gym webui` against a hostile pass (issue #39): it will not serve every interface without a password unless told
to, a port it cannot have or a runs folder that is a file is one line and exit status 2 before the page is built,
and a Hugging Face token given to a job never lands in the runs folder the page serves files from."""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path

import pytest
from tests.gym_cli import assert_only_an_error_line, gym_process

from gym.cli import main
from gym.core.errors import ConfigError, GymError
from gym.webui.jobs import CONFIG_NAME, JobStore

TOKEN = "hf_" + "S3cr3tT0kenNeverOnDisk"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("host", ["0", "0.0.0.0", "::", "0x0", "10.0.0.1"])
def test_every_interface_without_auth_refuses_to_start(host, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["webui", "--host", host, "--port", str(_free_port()), "--runs_dir", str(runs)]) == 2
    assert_only_an_error_line(capsys.readouterr().err, "without --auth", "--auth user:password", "--insecure-no-auth")
    assert not runs.exists()  # refused before anything was made


def test_the_refusal_as_a_process_exit_2_and_one_line(tmp_path):
    runs = tmp_path / "runs"
    done = gym_process("webui", "--host", "0", "--port", _free_port(), "--runs_dir", runs, timeout=120)
    assert done.returncode == 2
    assert_only_an_error_line(done.stderr, "0.0.0.0", "--insecure-no-auth")
    assert done.stdout == "" and not runs.exists()


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.0.2", "::1"])
def test_loopback_needs_no_auth_and_is_not_warned_about(host, tmp_path, capsys, caplog):
    """It gets past the check (and fails on the port held here, so no page is built)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as held:
        held.bind((host, 0))
        held.listen()
        port = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            assert main(["webui", "--host", host, "--port", str(port), "--runs_dir", str(tmp_path / "r")]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"port {port}", "in use")
    assert "without --auth" not in caplog.text


def test_insecure_no_auth_gets_past_the_refusal_with_one_warning(tmp_path, capsys, caplog):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            code = main(["webui", "--host", "0", "--insecure-no-auth", "--port", str(port), "--runs_dir",
                         str(tmp_path / "r")])
    assert code == 2
    assert_only_an_error_line(capsys.readouterr().err, f"port {port}", "in use")
    warned = [r for r in caplog.records if "without --auth" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING


def test_auth_on_every_interface_is_not_warned_about(tmp_path, capsys, caplog):
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            code = main(["webui", "--host", "0.0.0.0", "--auth", "u:p", "--port", str(port), "--runs_dir",
                         str(tmp_path / "r")])
    assert code == 2 and "in use" in capsys.readouterr().err
    assert "without --auth" not in caplog.text


def test_serving_every_interface_with_insecure_no_auth_warns_once(tmp_path, caplog, recwarn):
    from gym.webui.app import serve

    with caplog.at_level(logging.WARNING):
        demo, url = serve(host="0.0.0.0", port=_free_port(), runs_dir=str(tmp_path / "runs"), block=False,
                          insecure_no_auth=True)
    demo.close()
    assert len([r for r in caplog.records if "without --auth" in r.getMessage()]) == 1
    assert not [w for w in recwarn if "without --auth" in str(w.message)]  # once: a log line, not also a warning
    with pytest.raises(ConfigError, match="--insecure-no-auth"):
        serve(host="0.0.0.0", port=_free_port(), runs_dir=str(tmp_path / "runs"), block=False)


@pytest.mark.parametrize("port, fragment", [("70000", "1 to 65535"), ("-1", "1 to 65535"), ("0", "1 to 65535")])
def test_an_impossible_port_is_one_line(port, fragment, tmp_path, capsys):
    assert main(["webui", "--port", port, "--runs_dir", str(tmp_path / "runs")]) == 2
    assert_only_an_error_line(capsys.readouterr().err, f"--port {port}", fragment)
    assert not (tmp_path / "runs").exists()


def test_a_taken_port_as_a_process_is_exit_2_before_the_page_is_built(tmp_path):
    runs = tmp_path / "runs"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = gym_process("webui", "--port", port, "--runs_dir", runs, timeout=120)
    assert done.returncode == 2
    assert_only_an_error_line(done.stderr, f"port {port}", "in use", "--port")
    assert not runs.exists()


@pytest.mark.parametrize("inside", [False, True])
def test_a_runs_dir_that_is_a_file_is_one_line(inside, tmp_path, capsys):
    blocker = tmp_path / "runs.txt"
    blocker.write_text("not a folder")
    runs = blocker / "webui" if inside else blocker
    assert main(["webui", "--port", str(_free_port()), "--runs_dir", str(runs)]) == 2
    assert_only_an_error_line(capsys.readouterr().err, str(blocker), "not a folder")
    assert blocker.read_text() == "not a folder"


def test_the_port_lost_between_the_check_and_gradio_is_still_one_error(tmp_path, monkeypatch):
    """Another program can take the port while the page is built; Gradio's own failure then says the same."""
    import gym.webui.app as app

    checks: list[int] = []
    real_check = app.check_port

    def passes_first(host: str, port: int) -> None:  # the race: the first check passed, then the port was taken
        checks.append(port)
        if len(checks) > 1:
            real_check(host, port)

    monkeypatch.setattr(app, "check_port", passes_first)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} .*in use"):
            app.serve(port=port, runs_dir=str(tmp_path / "runs"), block=False)
    assert checks == [port, port]


# --- secrets: the runs folder is served to the page, so no token may be written into it ---------------------

def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _env_probe(seen: Path) -> list[str]:
    """A job command that writes what HF_TOKEN its process got to `seen` (outside the runs folder)."""
    return [sys.executable, "-c", f"import os, pathlib; pathlib.Path({str(seen)!r}).write_text("
                                  "os.environ.get('HF_TOKEN', '<unset>'))"]


def test_a_hub_token_goes_to_the_jobs_environment_never_into_its_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "private model", ["train", "{config}"],
                       config={"model_name_or_path": "org/private", "hf_hub_token": TOKEN, "hub_token": TOKEN})
    written = (job.folder / CONFIG_NAME).read_text()
    assert "org/private" in written and "hub_token" not in written
    seen = tmp_path / "seen"
    job.argv = _env_probe(seen)
    store.start(job)
    assert store.wait(job, timeout=60) == 0
    assert seen.read_text() == TOKEN  # the job still gets it
    assert _files_holding(tmp_path / "runs", TOKEN) == []
    assert TOKEN not in os.environ.get("HF_TOKEN", "")  # and the server's own environment is left alone


def test_a_restarted_server_resumes_a_token_job_only_with_the_token_in_its_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    first = JobStore(tmp_path / "runs")
    job = first.create("train", "t", ["train", "{config}"], config={"stage": "sft", "hf_hub_token": TOKEN})
    seen = tmp_path / "seen"
    job.argv = _env_probe(seen)
    first.start(job)
    assert first.wait(job, timeout=60) == 0 and seen.read_text() == TOKEN
    assert first.wait(first.restart(first.get(job.id)), timeout=60) == 0  # the same server remembers it
    assert seen.read_text() == TOKEN

    restarted = JobStore(tmp_path / "runs")  # a new server process: nothing in memory, nothing on disk
    with pytest.raises(GymError, match="HF_TOKEN"):
        restarted.restart(restarted.get(job.id))
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheServersEnvironment")
    assert restarted.wait(restarted.restart(restarted.get(job.id)), timeout=60) == 0
    assert seen.read_text() == "hf_fromTheServersEnvironment"
    assert _files_holding(tmp_path / "runs", TOKEN) == []


def test_two_different_hub_tokens_are_refused(tmp_path):
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "t", ["train", "{config}"])
    with pytest.raises(ConfigError, match="hf_hub_token.*hub_token"):
        store.write_config(job, {"hf_hub_token": TOKEN, "hub_token": TOKEN + "x"})
    assert not (job.folder / CONFIG_NAME).exists()


@pytest.mark.slow
def test_a_training_job_with_a_hub_token_trains_and_leaves_no_trace_of_it(tmp_path, train_config, monkeypatch):
    """The whole job, as the Train tab starts it: config.yaml, console.log, the run's gym_config.yaml,
    training_args.bin and every other file in the served folder are free of the token."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    store = JobStore(tmp_path / "runs")
    job = store.create("train", "sft", ["train", "{config}"], output="{job}/output")
    store.write_config(job, train_config(output_dir=job.output, max_steps=1, save_strategy="steps", save_steps=1,
                                         hf_hub_token=TOKEN, hub_token=TOKEN))
    store.start(job)
    assert store.wait(job, timeout=300) == 0, store.get(job.id).console()
    assert (job.folder / "output" / "gym_manifest.json").is_file()
    assert _files_holding(tmp_path / "runs", TOKEN) == []
