"""Fixtures shared by the kernel tests."""

from __future__ import annotations

import pytest
import torch

from gym.infer.fast import kernel_build, kernels


@pytest.fixture(scope="module", params=kernel_build.VARIANTS)
def ops(request):
    """The compiled ops, once per instruction-set variant this CPU runs (each forced in turn, so the AVX2 and
    portable paths are checked on an AVX-512 machine too); skips when they are not available here."""
    status = kernels.kernel_status()
    if status is not None:
        pytest.skip(f"the compiled gym kernels are not available here ({status}); the reference paths are tested too")
    if request.param not in kernels.runnable_isas():
        pytest.skip(f"this CPU cannot run the {request.param} kernels")
    assert kernels.use_isa(request.param) == request.param == kernels.kernel_isa()
    yield torch.ops.gym_kernels
    kernels.use_isa("auto")
