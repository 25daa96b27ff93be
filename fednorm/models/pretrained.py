"""ImageNet-pretrained weights from a local torchvision checkpoint (HBN Table 5's "pretrained" models).

HBN's Table 5 builds torchvision's ``resnet18``/``resnet50``/``vgg11_bn``/``vgg19_bn``/
``mobilenet_v2`` with ``pretrained=True`` and then replaces every ``BatchNorm2d`` by a *fresh*
BN, GN or HBN layer (its ``replace_bn_with_*`` builds new layers), so only the convolutions and
linear layers keep ImageNet's weights (HBN, Chen et al., 2025, Table 5, and the authors' ``Nets.py``).
fednorm's builders for those architectures take ``pretrained=PATH``: the path of a torchvision
state dict saved on disk (this machine has no network; the files are torchvision's, listed in
:data:`TORCHVISION_WEIGHTS`), and :func:`load_torchvision_weights` maps its keys onto the fednorm
model with the model's own renaming rule (``fc`` -> ``head``, ``layer1.0.bn1`` ->
``layers.0.0.norm1`` ...).

What is loaded, decided by the *fednorm* module each tensor lands in (its type, never its name):

* convolutions and the hidden linear layers: always, and every one of them must be in the file
  with the same shape (a different stem or classifier form is an error naming the option to use);
* the head ``Linear``: only when its shape matches (``num_classes=1000``); otherwise it keeps its
  fresh initialisation, the n-class head the spec recommends (§5 row 17; the HBN code keeps
  torchvision's 1000-way head for all but ResNet-18);
* normalization layers (``pretrained_norm``): ``"fresh"`` (default, HBN's code) loads none of the
  checkpoint's BatchNorm tensors, whatever the norm; ``"load"`` copies BN's affine ``weight``/
  ``bias`` into any norm layer with per-channel affine parameters of that shape (BN, GN, LN, FBN,
  HBN) and BN's ``running_mean``/``running_var``/``num_batches_tracked`` into layers that keep
  those buffers (BatchNorm subclasses: BN, FBN, HBN, whose buffers are their global statistics,
  so HBN's ``global_mean``/``global_var`` start from ImageNet's statistics, as
  :func:`~fednorm.nn.norms.convert_norm` carries them, and its ``alpha`` stays 0); GN and LN take
  the affine parameters only. ``norm="none"`` drops the BN tensors either way.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Literal, Mapping

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..nn.norms import NORM_TYPES

__all__ = ["PretrainedNorm", "TORCHVISION_WEIGHTS", "load_torchvision_weights", "read_state_dict", "rename_state"]

PretrainedNorm = Literal["fresh", "load"]

#: The torchvision ImageNet checkpoints HBN's ``pretrained=True`` meant (torchvision's
#: ``IMAGENET1K_V1`` weights), by fednorm model name. Download one where there is a network, e.g.
#: ``curl -O https://download.pytorch.org/models/resnet50-0676ba61.pth``, and pass its path as
#: ``model_args: {pretrained: /path/resnet50-0676ba61.pth}``.
TORCHVISION_WEIGHTS: dict[str, str] = {
    "resnet18": "https://download.pytorch.org/models/resnet18-f37072fd.pth",
    "resnet50": "https://download.pytorch.org/models/resnet50-0676ba61.pth",
    "vgg11": "https://download.pytorch.org/models/vgg11_bn-6002323d.pth",
    "vgg19": "https://download.pytorch.org/models/vgg19_bn-c79401a0.pth",
    "mobilenet_v2": "https://download.pytorch.org/models/mobilenet_v2-b0353104.pth",
}

#: A model's renaming rule: torchvision key -> fednorm key.
KeyMap = Callable[[str], str]


def read_state_dict(source: str | os.PathLike | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict from a file (``torch.load(weights_only=True)``, on CPU) or a mapping.

    Raises:
        ConfigError: the file is missing or does not hold a mapping of tensors.
    """
    if isinstance(source, Mapping):
        state = dict(source)
    else:
        path = Path(os.path.expandvars(os.fspath(source))).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"pretrained weights not found at {path}: pass the path of a torchvision checkpoint saved on this "
                f"machine (fednorm does not download it; URLs in fednorm.models.pretrained.TORCHVISION_WEIGHTS; "
                f"configs name them as $FEDNORM_WEIGHTS/<file>)"
            )
        _check_torchvision_hash(path)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or non-torch file
            raise ConfigError(f"pretrained weights at {path} could not be read as a torch state dict: {exc}") from None
        if isinstance(state, Mapping) and "state_dict" in state and isinstance(state["state_dict"], Mapping):
            state = dict(state["state_dict"])
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError("pretrained weights must be a state dict (a mapping of names to tensors), as torchvision saves")
    return dict(state)


def _check_torchvision_hash(path: Path) -> None:
    """A file named as one of torchvision's checkpoints (``resnet50-0676ba61.pth``) must have the
    SHA-256 whose first hex digits its name carries (torch.hub's ``check_hash``), so a truncated or
    other file under that name is refused rather than trained from."""
    names = {url.rsplit("/", 1)[1] for url in TORCHVISION_WEIGHTS.values()}
    if path.name not in names:
        return
    prefix = path.stem.rsplit("-", 1)[1]
    digest = hashlib.sha256(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if not digest.hexdigest().startswith(prefix):
        raise ConfigError(f"pretrained weights at {path} are corrupted: their SHA-256 does not start with {prefix}, as "
                          f"torchvision's file of that name does; download it again")


def _owner(model: nn.Module, key: str) -> tuple[nn.Module | None, str]:
    """The module that would hold ``key`` (``None`` if the path does not exist) and the tensor's name."""
    path, _, name = key.rpartition(".")
    try:
        return (model.get_submodule(path) if path else model), name
    except AttributeError:
        return None, name


def _is_norm_slot(module: nn.Module) -> bool:
    """A normalization layer, or ``nn.Identity`` standing where one would be (``norm="none"``)."""
    return isinstance(module, NORM_TYPES) or isinstance(module, nn.Identity)


def load_torchvision_weights(
    model: nn.Module,
    source: str | os.PathLike | Mapping[str, torch.Tensor],
    key_map: KeyMap,
    *,
    norm: PretrainedNorm = "fresh",
    arch: str = "model",
) -> dict[str, list[str]]:
    """Load a torchvision checkpoint into a fednorm model, in place (module docstring).

    Args:
        model: the fednorm model, built with the form the checkpoint has (e.g. ``stem="imagenet"``).
        source: path of the checkpoint, or a state dict.
        key_map: the model's renaming rule from torchvision keys to its own.
        norm: ``"fresh"`` (HBN's code: no BatchNorm tensor is loaded) or ``"load"``.
        arch: the model's name, for messages.

    Returns:
        ``{"loaded": [...], "fresh_head": [...], "norm_skipped": [...]}``: fednorm keys loaded, head
        keys left at their initialisation (shape differs), and checkpoint norm keys not loaded.

    Raises:
        ConfigError: a convolution or hidden linear layer of the model is missing from the file or
            has another shape, or the file has tensors the model has no place for.
    """
    if norm not in ("fresh", "load"):
        raise ValueError(f"Unknown value '{norm}' for argument pretrained_norm. Valid values are ('fresh', 'load')")
    state = read_state_dict(source)
    head = getattr(model, "head", None)
    target = model.state_dict()
    loaded: dict[str, torch.Tensor] = {}
    fresh_head: list[str] = []
    norm_skipped: list[str] = []
    unexpected: list[str] = []
    mismatched: list[str] = []
    for src_key, value in state.items():
        key = key_map(src_key)
        owner, name = _owner(model, key)
        if owner is None:
            unexpected.append(src_key)
        elif _is_norm_slot(owner):
            ok = norm == "load" and key in target and target[key].shape == value.shape
            if ok and name in ("running_mean", "running_var", "num_batches_tracked"):
                ok = isinstance(owner, _BatchNorm)
            if ok:
                loaded[key] = value
            else:
                norm_skipped.append(src_key)
        elif owner is head:
            if key in target and target[key].shape == value.shape:
                loaded[key] = value
            else:
                fresh_head.append(key)
        elif key not in target:
            unexpected.append(src_key)
        elif target[key].shape != value.shape:
            mismatched.append(f"{src_key} -> {key}: {tuple(value.shape)} vs {tuple(target[key].shape)}")
        else:
            loaded[key] = value
    # every tensor of a layer that is neither a norm nor the head must come from the file
    missing = []
    for key in target:
        owner, _ = _owner(model, key)
        if owner is not None and not _is_norm_slot(owner) and owner is not head and key not in loaded:
            missing.append(key)
    if unexpected or mismatched or missing:
        parts = []
        if mismatched:
            parts.append(f"shapes differ: {'; '.join(mismatched[:4])}")
        if missing:
            parts.append(f"not in the file: {', '.join(missing[:4])}")
        if unexpected:
            parts.append(f"no place in the model for: {', '.join(unexpected[:4])}")
        raise ConfigError(
            f"pretrained weights do not fit {arch} as built ({'; '.join(parts)}). The checkpoint is torchvision's "
            f"ImageNet {arch}: build the same form (ResNets stem='imagenet', VGG classifier='imagenet', "
            f"MobileNetV2 either stem) with in_channels=3"
        )
    with torch.no_grad():
        for key, value in loaded.items():
            target[key].copy_(value.to(dtype=target[key].dtype))
    return {"loaded": sorted(loaded), "fresh_head": fresh_head, "norm_skipped": norm_skipped}


def rename_state(state: Mapping[str, torch.Tensor], key_map: KeyMap) -> dict[str, torch.Tensor]:
    """``state`` with every key renamed by ``key_map`` (e.g. a model's ``to_torchvision_key``, to
    export a fednorm model as a torchvision checkpoint)."""
    return {key_map(k): v for k, v in state.items()}
