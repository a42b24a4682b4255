"""The method registry: one line per training method, and the only place stages are listed."""

from gym.train.method import Method
from gym.train.methods import pt, sft

METHODS: dict[str, Method] = {
    "pt": pt.METHOD,
    "sft": sft.METHOD,
}
