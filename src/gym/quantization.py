"""`from gym.quantization import BitDeltaConfig, ...`: the Gym documents' module name for delta compression, kept
as a facade at the door. Inside Gym these are deltas (gym.delta), and "quantization" means only a base model loaded
quantized for training; the other spellings are listed in gym.config.aliases.

BitDelta (1 bit per weight plus distilled scales) and DeltaQuant (int8/int4/int2, ternary, binary,
mixed precision) compress the difference between a fine-tune and its base.
"""

from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.compress import CompressedDelta
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.tensor_quant import QuantMethod
from gym.soup import AggregationMethod, DeltaSoup, DeltaSoupConfig

__all__ = ["AggregationMethod", "BitDeltaConfig", "BitDeltaQuantizer", "CompressedDelta", "DeltaQuantConfig",
           "DeltaQuantizer", "DeltaSoup", "DeltaSoupConfig", "QuantMethod"]
