"""Importing what loads transformers (and with it torchao and bitsandbytes) prints none of their notes on
optional extensions, while their other warnings still show (gym.core.library_noise)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _stderr(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=300).stderr


def test_loading_the_model_stack_prints_no_optional_extension_notes():
    stderr = _stderr("import gym.models.loader, gym.models.base_quantization; import torchao")
    for noise in ("_C_mxfp8", "Failed to load", "is an Enum subclass"):
        assert noise not in stderr, stderr


def test_deepspeed_finding_no_gpu_prints_nothing_on_stdout():
    """Imported (by a DeepSpeed run, or by accelerate on every save before gym.core.deepspeed_probe), deepspeed
    printed "Setting accelerator to CPU ..." on stdout, into the answer of a first `gym chat --prompt`."""
    pytest.importorskip("deepspeed")
    done = subprocess.run([sys.executable, "-c", "import gym.models.loader, deepspeed, logging; "
                           "logging.getLogger('DeepSpeed').warning('a real warning')"],
                          capture_output=True, text=True, check=True, timeout=300)
    assert "Setting accelerator to CPU" not in done.stdout + done.stderr
    assert "a real warning" in done.stdout  # its other warnings still show, where deepspeed prints them


def test_the_libraries_other_warnings_and_debug_runs_still_show():
    stderr = _stderr("import logging, gym.models.loader; logging.getLogger('torchao').warning('a real warning'); "
                     "logging.getLogger('torchao').error('Failed to load weights.so: a real error')")
    assert "a real warning" in stderr
    assert "Failed to load weights.so: a real error" in stderr  # the notes' words, but an error
    # Asked for (the logger at DEBUG, as `gym ... --debug` sets it), the notes are shown again.
    assert "_C_mxfp8" in _stderr("import logging; logging.getLogger('torchao').setLevel(logging.DEBUG); "
                                 "import gym.models.loader; import torchao")
