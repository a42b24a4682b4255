"""`delta_compression:` in a training config: the trained model, stored as a delta from its base too."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from gym.config.args import TrainArgs
from gym.core.errors import ConfigError
from gym.core.files import MANIFEST_FILE
from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.weights import load_model
from gym.models.loader import load_tokenizer

logger = logging.getLogger(__name__)

DELTA_FILE = "delta.safetensors"


def quantizer_for_training(args: TrainArgs[Any]) -> BitDeltaQuantizer | DeltaQuantizer:
    """The run's delta options as a quantizer; BitDelta distils its scales on the training data."""
    finetuning = args.finetuning
    if finetuning.delta_compression is None:
        raise ConfigError("delta_compression is not set: there is no delta to compress.")
    if finetuning.delta_compression == "bitdelta":
        return BitDeltaQuantizer(BitDeltaConfig(
            group_size=finetuning.delta_group_size, distill_steps=finetuning.delta_distill_steps,
            safety_threshold=finetuning.delta_safety_threshold, enable_deltasoup=finetuning.delta_enable_deltasoup,
            calibration=args.data.dataset if finetuning.delta_distill_steps else None,
            calibration_dir=args.data.dataset_dir, seed=args.training.seed))
    return DeltaQuantizer(DeltaQuantConfig(method=finetuning.delta_compression, group_size=finetuning.delta_group_size,
                                           enable_deltasoup=finetuning.delta_enable_deltasoup))


def compress_output(args: TrainArgs[Any], output_dir: str | Path) -> Path:
    output_dir = Path(output_dir)
    base_path = json.loads((output_dir / MANIFEST_FILE).read_text())["resolved_base_path"]
    quantizer = quantizer_for_training(args)
    logger.info("Compressing the result as a %s delta from %s ...", args.finetuning.delta_compression, base_path)
    result = quantizer.compress(load_model(base_path), load_model(str(output_dir), base_path),
                                tokenizer=load_tokenizer(base_path) if quantizer.needs_tokenizer else None,
                                base_name=args.model.model_name_or_path,
                                progress=not args.training.disable_tqdm)
    path = result.save(output_dir / DELTA_FILE, overwrite=True)  # part of this run's own output
    logger.info("Delta: %s (%d bytes) in %.0f s.", path, path.stat().st_size, result.seconds)
    return path
