"""What libraries under Gym say at import about optional compiled extensions they could not load.

transformers imports torchao (to register its quantizer) and bitsandbytes wherever it loads a model, and
each says, once per process, that an optional extension is missing: torchao's prebuilt `_C_mxfp8` and
`_C_cutlass_90a` libraries (built for other CUDA/Python versions), bitsandbytes' CPU 4-bit kernels from the
`kernels` package, torch's note on the enums torchao registers, and transformers' note that an image
processor runs on Pillow because torchvision is not installed; and deepspeed, where it is installed, that it
found no GPU. They work without them, and nothing a user does changes it; a benchmark that starts a process per
configuration printed them by the page.

A filter on each of those loggers drops exactly those records, at warning level (an error is always
shown). It is installed when gym is imported, the one place that runs before any of Gym's many imports of
transformers; every other warning and error of these libraries still shows, and these notes do too when
their logger is set to DEBUG (`gym ... --debug`).
"""

from __future__ import annotations

import logging
import re

# logger -> the records it drops (re.match against the formatted message)
OPTIONAL_EXTENSIONS = {
    "torchao": re.compile(r"Failed to load \S+\.so: "),
    "bitsandbytes.backends.cpu.ops": re.compile(r"Failed to load CPU gemm_4bit_forward from kernels-community"),
    "torch.utils._pytree": re.compile(r"<enum '\w+'> is an Enum subclass and is now natively supported"),
    # Without torchvision, transformers 5 swaps an image processor for its Pillow twin (the same numbers).
    "transformers.utils.import_utils": re.compile(r"`\w+` requires torchvision \(not installed\); falling back to"),
    # deepspeed, where a run or a user's code imports it (accelerate no longer does for every save:
    # gym.core.deepspeed_probe), picks the CPU on a machine without a GPU and says so on stdout, where
    # `gym chat --prompt` printed its answer.
    "DeepSpeed": re.compile(r"Setting accelerator to CPU\. If you have GPU or other accelerator, we were unable"),
}


class _MissingOptionalExtension(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR or logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return True
        return self.pattern.match(record.getMessage()) is None


def quiet_optional_extensions() -> None:
    """Install the filters (once per logger)."""
    for name, pattern in OPTIONAL_EXTENSIONS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _MissingOptionalExtension) for f in logger.filters):
            logger.addFilter(_MissingOptionalExtension(pattern))
