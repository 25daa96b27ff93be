"""Federated methods: what is shared, what stays local, and how the server aggregates."""

from .base import ClientContext, ClientUpdates, Method, weighted_average
from .fedavg import FedAvg
from .fedbn import FedBN, SiloBN
from .hbn import HBN
from .singleset import SingleSet
from .registry import METHODS, get_method, list_methods, register_method

__all__ = [
    "ClientContext",
    "ClientUpdates",
    "Method",
    "weighted_average",
    "FedAvg",
    "FedBN",
    "SiloBN",
    "HBN",
    "SingleSet",
    "METHODS",
    "get_method",
    "list_methods",
    "register_method",
]
