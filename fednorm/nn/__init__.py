"""Normalization layers and the tools to use them in federated models.

``get_norm_layer`` resolves a norm by name (``"bn"``, ``"gn"``, ``"ln"``, ``"none"``, and the
methods' own layers as they are registered); ``convert_norm`` swaps a model's BatchNorms;
``state_keys``/``batch_norm_keys`` select tensors by owning module type, ``classifier_head``
finds a model's classifier; the functional core pools cross-client statistics exactly and
normalises across clients through a ``ClientComm``.
"""

from .comm import ClientComm, CommTraffic, LocalClientComm
from .functional import channel_stats, cross_client_batch_norm, pooled_stats
from .norms import NORMS, convert_norm, get_norm_layer, is_batch_norm, list_norms, norm_modules, register_norm
from .state import batch_norm_keys, classifier_head, floating_keys, state_keys
from .hbn import (  # registers the "hbn" norm
    HBNStats,
    HybridBatchNorm,
    HybridBatchNorm1d,
    HybridBatchNorm2d,
    collect_hbn_statistics,
    convert_to_batchnorm,
    convert_to_hybrid,
    hybrid_batch_norm,
)
from .fbn import (  # registers the "fbn" norm
    FederatedBatchNorm,
    FederatedBatchNorm1d,
    FederatedBatchNorm2d,
    fbn_aggregate,
    fbn_local_update,
    federated_batch_norm,
    recording_fbn_statistics,
)
from .feature_norm import FeatureNorm, FeatureNormClassifier, feature_norm, with_feature_norm
from .ln_variants import ScaleNorm, Shift, norm_placement  # registers ln_static, ln_before, ln_reduced, fn, fn_every, ...
from .weight_std import (  # registers gn_ws
    ScaledStdConv2d,
    StdConv2d,
    convert_weight_standardization,
    revert_weight_standardization,
    standardize_weight,
)
from .nf import adaptive_grad_clip_  # registers fedwon, hbn_sws

__all__ = [
    "StdConv2d",
    "convert_weight_standardization",
    "ScaledStdConv2d",
    "adaptive_grad_clip_",
    "revert_weight_standardization",
    "standardize_weight",
    "ClientComm",
    "CommTraffic",
    "LocalClientComm",
    "channel_stats",
    "cross_client_batch_norm",
    "pooled_stats",
    "NORMS",
    "convert_norm",
    "get_norm_layer",
    "is_batch_norm",
    "list_norms",
    "norm_modules",
    "register_norm",
    "batch_norm_keys",
    "floating_keys",
    "state_keys",
    "classifier_head",
    "HBNStats",
    "HybridBatchNorm",
    "HybridBatchNorm1d",
    "HybridBatchNorm2d",
    "collect_hbn_statistics",
    "convert_to_batchnorm",
    "convert_to_hybrid",
    "hybrid_batch_norm",
    "FederatedBatchNorm",
    "FederatedBatchNorm1d",
    "FederatedBatchNorm2d",
    "fbn_aggregate",
    "fbn_local_update",
    "federated_batch_norm",
    "recording_fbn_statistics",
    "FeatureNorm",
    "FeatureNormClassifier",
    "feature_norm",
    "with_feature_norm",
    "ScaleNorm",
    "Shift",
    "norm_placement",
]
