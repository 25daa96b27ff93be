"""Federated methods: what is shared, what stays local, and how the server aggregates."""

from .base import ClientUpdates, Method, weighted_average
from .fedavg import FedAvg
from .registry import METHODS, get_method, list_methods, register_method

__all__ = [
    "ClientUpdates",
    "Method",
    "weighted_average",
    "FedAvg",
    "METHODS",
    "get_method",
    "list_methods",
    "register_method",
]
