"""The seeds' public names for delta compression: `from gym.quantization import BitDeltaConfig, ...`.

BitDelta (1 bit per weight plus distilled scales) and DeltaQuant (int8/int4/int2, ternary, binary,
mixed precision) compress the difference between a fine-tune and its base; see gym.delta.
"""

from gym.delta.bitdelta import BitDeltaConfig, BitDeltaQuantizer
from gym.delta.compress import CompressedDelta
from gym.delta.deltaquant import DeltaQuantConfig, DeltaQuantizer
from gym.delta.tensor_quant import QuantMethod
from gym.soup import AggregationMethod, DeltaSoup, DeltaSoupConfig

__all__ = ["AggregationMethod", "BitDeltaConfig", "BitDeltaQuantizer", "CompressedDelta", "DeltaQuantConfig",
           "DeltaQuantizer", "DeltaSoup", "DeltaSoupConfig", "QuantMethod"]
