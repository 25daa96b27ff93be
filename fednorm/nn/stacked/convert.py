"""The converter: :func:`stack_model` turns a network into its stacked form, layer by layer, and
verifies the stacked forward against the base model client by client before it is used."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .fbn import StackedFederatedBatchNorm
from .hbn import StackedHybridBatchNorm
from .layers import ClientPadShortcut, StackedConv2d, StackedLinear, StackedScaledStdConv2d, StackedStdConv2d
from .layout import NotStackableError, from_client_layout, to_client_layout
from .norms import ClientFeatureNorm, StackedBatchNorm, StackedGroupNorm

__all__ = ["stack_model"]


# Modules without tensors of their own that act per channel or element-wise.
_PASSTHROUGH = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU,
    nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d,
    nn.Dropout, nn.Dropout2d, nn.Identity, nn.Flatten,
)


def _convert(module: nn.Module, k: int) -> nn.Module:
    from ...models.resnet import PadShortcut
    from ..weight_std import ScaledStdConv2d, StdConv2d

    if isinstance(module, ScaledStdConv2d):
        return StackedScaledStdConv2d(module, k)
    if isinstance(module, StdConv2d):
        return StackedStdConv2d(module, k)
    if isinstance(module, nn.Conv2d):
        if type(module) is not nn.Conv2d:  # a subclass changes the forward: stacking it as a plain conv would be wrong
            raise NotStackableError(f"{type(module).__name__} has no stacked version yet")
        return StackedConv2d(module, k)
    if isinstance(module, nn.Linear):
        return StackedLinear(module, k)
    from ..fbn import FederatedBatchNorm
    from ..hbn import HybridBatchNorm

    if isinstance(module, FederatedBatchNorm):
        return StackedFederatedBatchNorm(module, k)
    if isinstance(module, HybridBatchNorm):
        return StackedHybridBatchNorm(module, k)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        if type(module) not in (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm):
            # A subclass (e.g. HBN) changes the forward; treating it as BN would be silently wrong.
            raise NotStackableError(f"{type(module).__name__} has no stacked version yet")
        return StackedBatchNorm(module, k)
    if isinstance(module, nn.GroupNorm):
        return StackedGroupNorm(module, k)
    if isinstance(module, PadShortcut):
        return ClientPadShortcut(module)
    from ..feature_norm import FeatureNorm, FeatureNormClassifier

    if isinstance(module, FeatureNorm):
        return ClientFeatureNorm(module)
    if isinstance(module, FeatureNormClassifier):
        # The wrapper shares its wrapped model's children: convert those once, re-register them.
        inner = _convert(module.model, k)
        for name, child in inner.named_children():
            setattr(module, name, child)
        module.feature_norm = ClientFeatureNorm(module.feature_norm)
        return module
    if isinstance(module, nn.Flatten) and module.start_dim != 1:
        raise NotStackableError(f"Flatten(start_dim={module.start_dim}) is not supported")
    own = list(module._parameters.values()) + list(module._buffers.values())
    if any(t is not None for t in own) and not isinstance(module, _PASSTHROUGH):
        raise NotStackableError(
            f"{type(module).__name__} holds tensors of its own and has no stacked version"
        )
    for name, child in module.named_children():
        setattr(module, name, _convert(child, k))
    return module


def stack_model(
    model: nn.Module, num_clients: int, *, example_input: torch.Tensor | None = None, verify: bool = True
) -> nn.Module:
    """A stacked copy of ``model`` holding ``num_clients`` clients (the model is not modified).

    Args:
        model: a network built from supported layers (every model in ``fednorm.models``).
        num_clients: the client count K.
        example_input: a ``[B, C, H, W]`` batch used to verify the stacked forward against
            the base model, client by client, in train and eval mode. Required when ``verify``.
        verify: run the verification (recommended; it costs two small forward passes).

    Raises:
        NotStackableError: a module has no stacked version, or the verification failed.
    """
    stacked = _convert(copy.deepcopy(model), num_clients)
    keys_base = {k: v.shape for k, v in model.state_dict().items()}
    keys_stacked = {k: v.shape for k, v in stacked.state_dict().items()}
    if set(keys_base) != set(keys_stacked):
        raise NotStackableError(f"stacked state keys differ: {sorted(set(keys_base) ^ set(keys_stacked))}")
    for key, shape in keys_base.items():
        if keys_stacked[key] != (num_clients, *shape):
            raise NotStackableError(f"stacked '{key}' has shape {tuple(keys_stacked[key])}, expected {(num_clients, *shape)}")
    if verify:
        if example_input is None:
            raise ValueError("example_input is required to verify the stacked model")
        key = _structure_key(model, num_clients, example_input)
        if key not in _VERIFIED:
            _verify(model, num_clients, example_input)
            _VERIFIED.add(key)
    return stacked


# The structures this process has verified: the check reads the layers' code and settings, not
# their values, so a run set's runs of one model (and a test suite's) verify it once.
_VERIFIED: set[tuple] = set()
_PLAIN = (bool, int, float, str, type(None))


def _structure_key(model: nn.Module, k: int, x: torch.Tensor) -> tuple:
    """Every module's type, repr and plain settings (the attributes a forward may branch on), the
    client count and the example's shape: what the verification's outcome depends on."""
    layers = tuple(
        (name, type(m).__module__, type(m).__qualname__, m.extra_repr(),
         tuple(sorted((a, v) for a, v in vars(m).items()
                      if a != "training" and not a.startswith("_")
                      and (isinstance(v, _PLAIN) or isinstance(v, tuple) and all(isinstance(e, _PLAIN) for e in v)))))
        for name, m in model.named_modules()
    )
    return layers, k, tuple(x.shape)


def _train_without_dropout(model: nn.Module, training: bool) -> None:
    """Train/eval mode, with dropout off: its random masks cannot match across layouts."""
    model.train(training)
    for m in model.modules():
        if isinstance(m, (nn.Dropout, nn.Dropout2d)):
            m.eval()


@torch.no_grad()
def _verify(model: nn.Module, k: int, x: torch.Tensor) -> None:
    """Perturb each client's copy differently and compare the stacked forward with the base one.

    The probe is a float64 conversion of ``model`` made here (the conversion is deterministic,
    so it checks the one returned, which it never touches). One noise draw per tensor, scaled by
    the client's index, makes the clients' states differ (a layout error mixing clients is O(1));
    the reference forwards reload one float64 copy of the base model. This keeps the check to a
    few model copies, not a few per client: it runs whenever a run builds a vectorized executor."""
    # In float64 so rounding (1e-12) cannot be mistaken for a layout error (O(1)).
    base = copy.deepcopy(model).double().cpu()
    probe = _convert(copy.deepcopy(base), k)
    x = x.detach().double().cpu()
    gen = torch.Generator().manual_seed(1234)
    stacked_state = {}
    for name, t in base.state_dict().items():
        if t.is_floating_point():
            noise = torch.randn(t.shape, generator=gen, dtype=t.dtype).mul_(0.05)
            stacked_state[name] = torch.stack([t + noise * (i + 1) for i in range(k)])
        else:
            stacked_state[name] = torch.stack([t] * k)
    xs = torch.stack([x + 0.1 * i for i in range(k)])  # each client its own batch
    for training in (False, True):
        probe.load_state_dict(stacked_state)
        _train_without_dropout(probe, training)
        try:
            out = probe(to_client_layout(xs))
            if not isinstance(out, torch.Tensor):  # a tuple or dict of outputs: not logits
                raise NotStackableError(f"the model's forward returns a {type(out).__name__}, not a tensor of logits")
            out = from_client_layout(out, k)
        except (RuntimeError, ValueError) as exc:
            if isinstance(exc, NotStackableError):
                raise
            raise NotStackableError(f"the stacked forward fails: {exc}") from None
        for i in range(k):
            base.load_state_dict({name: t[i] for name, t in stacked_state.items()})
            _train_without_dropout(base, training)
            ref = base(xs[i])
            if out[i].shape != ref.shape or not torch.allclose(out[i], ref, rtol=1e-7, atol=1e-8):
                err = (out[i] - ref).abs().max().item() if out[i].shape == ref.shape else float("nan")
                raise NotStackableError(
                    f"the stacked forward differs from the model's own forward for client {i} "
                    f"({'train' if training else 'eval'} mode, max error {err:.3g}); its forward code "
                    "probably mixes channels of different clients (e.g. torch.cat on channels)"
                )
