"""Federated methods: what is shared, what stays local, and how the server aggregates."""

from .base import ClientContext, ClientUpdates, Method, weighted_average
from .fedavg import FedAvg
from .fedbn import FedBN, SiloBN
from .fedtan import FedTAN, FedTANForward
from .hbn import HBN
from .fbn import FBN
from .fixbn import FixBN
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
    "FedTAN",
    "FedTANForward",
    "HBN",
    "FBN",
    "FixBN",
    "SingleSet",
    "METHODS",
    "get_method",
    "list_methods",
    "register_method",
]
