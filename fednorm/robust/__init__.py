"""Byzantine robustness: robust aggregators (median, trimmed mean, NNM) and attacks (SF, FOE, ALIE)."""

from .aggregators import AGGREGATORS, Aggregator, get_aggregator, mean, median, nnm, register_aggregator, trimmed_mean
from .attacks import ATTACKS, ByzantineAttack, alie, alie_zmax, foe, get_attack, register_attack, sign_flip

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "get_aggregator",
    "mean",
    "median",
    "nnm",
    "register_aggregator",
    "trimmed_mean",
    "ATTACKS",
    "ByzantineAttack",
    "alie",
    "alie_zmax",
    "foe",
    "get_attack",
    "register_attack",
    "sign_flip",
]
