"""Batch invariance: a row's logits are the same bits alone and in any batch (mixed variants, several rows of one
variant, more than 16 rows, a prompt prefilled in other chunks or partly from the prefix cache), so a greedy
answer never depends on the load. Checked on every kernel path this machine can run, each in its own process
(the kernels are loaded once per process): the best variant this CPU runs, the AVX2 variant where the CPU has
more than AVX2, and the torch reference used where no kernels build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("batch_invariance_probe.py")


def _has_avx512() -> bool:
    from gym.infer.fast.kernels import runnable_isas

    # the kernels' own check (CPUID and the OS's register support): /proc/cpuinfo is the host's under qemu-user
    return any(isa.startswith("avx512") for isa in runnable_isas())


# The engine's own checks (scheduling, prefix cache) run on the best path; the arithmetic on every path.
PATHS = {
    "best": {},
    "avx2": {"GYM_KERNEL_ISA": "avx2", "BATCH_PROBE_ENGINE": "0"},
    "torch reference": {"GYM_NO_KERNELS": "1", "BATCH_PROBE_ENGINE": "0"},
}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
def test_a_rows_logits_do_not_depend_on_its_batch(path, tiny_model_dir, tmp_path):
    if path == "avx2" and not _has_avx512():
        pytest.skip("the AVX2 variant is checked on its own only where the CPU runs a better one")
    env = {**os.environ, **PATHS[path]}
    done = subprocess.run([sys.executable, str(PROBE), str(tiny_model_dir), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if path == "torch reference":
        assert report["kernels"] == "GYM_NO_KERNELS is set"
    else:
        from gym.infer.fast.kernels import runnable_isas

        best = runnable_isas()[0] if runnable_isas() else None
        assert report["kernels"] == "compiled" and report["isa"] == PATHS[path].get("GYM_KERNEL_ISA", best)
    # 3 formats x 5 rows (four variant kinds and the base) x 5 batch shapes, and the engine in two formats.
    assert len(report["checked"]) == 3 * 5 * 5 + (2 if path == "best" else 0)
