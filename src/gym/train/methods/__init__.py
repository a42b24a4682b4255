"""The method registry: one line per training method, and the only place stages are listed."""

from gym.train.method import Method
from gym.train.methods import dpo, grpo, kto, ppo, pt, rloo, rm, sft

METHODS: dict[str, Method] = {
    "pt": pt.METHOD,
    "sft": sft.METHOD,
    "rm": rm.METHOD,
    "dpo": dpo.METHOD,
    "orpo": dpo.ORPO,
    "simpo": dpo.SIMPO,
    "cpo": dpo.CPO,
    "kto": kto.METHOD,
    "ppo": ppo.METHOD,
    "grpo": grpo.METHOD,
    "gspo": grpo.GSPO,
    "rloo": rloo.METHOD,
}
