"""Loading torchvision checkpoints (HBN Table 5's "pretrained" models) from a local file."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fednorm.errors import ConfigError
from fednorm.models import get_model
from fednorm.models import mobilenet, resnet, vgg
from fednorm.models.pretrained import rename_state
from fednorm.nn.norms import norm_modules

# (name, fednorm options of torchvision's form, key renaming module, keys torchvision's state dict has)
FORMS = [
    ("resnet18", {"stem": "imagenet"}, resnet, 122),
    ("resnet50", {"stem": "imagenet"}, resnet, 320),
    ("vgg11", {"classifier": "imagenet"}, vgg, 62),
    ("mobilenet_v2", {"stem": "imagenet"}, mobilenet, 314),
]
# torchvision key names, written from torchvision's module layout (ResNet.layerN / Bottleneck.bnK / downsample,
# VGG.features / classifier, MobileNetV2.features[i].conv / classifier[1])
TORCHVISION_KEYS = {
    "resnet18": ["conv1.weight", "bn1.running_var", "layer1.0.bn2.weight", "layer2.0.downsample.0.weight",
                 "layer2.0.downsample.1.num_batches_tracked", "layer4.1.conv2.weight", "fc.bias"],
    "resnet50": ["layer1.0.conv3.weight", "layer1.0.bn3.bias", "layer1.0.downsample.1.running_mean", "layer3.5.bn2.weight",
                 "layer4.2.conv3.weight", "fc.weight"],
    "vgg11": ["features.0.weight", "features.1.running_mean", "features.26.weight", "classifier.0.weight",
              "classifier.3.bias", "classifier.6.weight"],
    "mobilenet_v2": ["features.0.0.weight", "features.0.1.weight", "features.1.conv.0.0.weight", "features.1.conv.2.running_var",
                     "features.2.conv.3.bias", "features.17.conv.2.weight", "features.18.1.weight", "classifier.1.weight"],
}


def _randomize_norms(model: nn.Module) -> None:
    with torch.no_grad():
        for _, m in norm_modules(model):
            m.weight.normal_(1.0, 0.2)
            m.bias.normal_()
            if isinstance(m, _BatchNorm):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.num_batches_tracked.fill_(7)


def _export(name, kwargs, module, tmp_path, num_classes=1000):
    """A fednorm model saved under torchvision's keys, as a torchvision checkpoint file."""
    torch.manual_seed(1)
    source = get_model(name, num_classes=num_classes, **kwargs)
    _randomize_norms(source)
    path = tmp_path / f"{name}.pth"
    torch.save(rename_state(source.state_dict(), module.to_torchvision_key), path)
    return source, path


@pytest.mark.parametrize("name,kwargs,module,num_keys", FORMS, ids=[f[0] for f in FORMS])
def test_checkpoint_under_torchvision_keys_round_trips(tmp_path, name, kwargs, module, num_keys):
    source, path = _export(name, kwargs, module, tmp_path)
    saved = torch.load(path, weights_only=True)
    assert len(saved) == num_keys and set(TORCHVISION_KEYS[name]) <= set(saved)
    torch.manual_seed(2)  # another initialisation: everything must come from the file
    loaded = get_model(name, num_classes=1000, pretrained=str(path), pretrained_norm="load", **kwargs)
    want, got = source.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_fresh_norms_and_an_n_class_head_keep_their_initialisation(tmp_path):
    source, path = _export("resnet50", {"stem": "imagenet"}, resnet, tmp_path)
    torch.manual_seed(3)
    ref = get_model("resnet50", num_classes=100, stem="imagenet")
    torch.manual_seed(3)
    loaded = get_model("resnet50", num_classes=100, stem="imagenet", pretrained=str(path))  # pretrained_norm: fresh
    src, got, init = source.state_dict(), loaded.state_dict(), ref.state_dict()
    norm_keys = {f"{n}.{t}" for n, m in norm_modules(loaded) for t, _ in [*m.named_parameters(), *m.named_buffers()]}
    for key in got:
        if key in norm_keys or key.startswith("head."):  # HBN's code: fresh norm layers; the spec: an n-class head
            assert torch.equal(got[key], init[key]), key
        else:
            assert torch.equal(got[key], src[key]), key
    assert len(norm_keys) == 53 * 5 and got["head.weight"].shape == (100, 2048)


def test_batch_norm_weights_map_into_group_norm_and_hbn(tmp_path):
    source, path = _export("mobilenet_v2", {"stem": "imagenet"}, mobilenet, tmp_path)
    src = source.state_dict()
    gn = get_model("mobilenet_v2", norm="gn", num_classes=1000, pretrained=str(path), pretrained_norm="load")
    for name, m in norm_modules(gn):
        assert isinstance(m, nn.GroupNorm)
        assert torch.equal(m.weight, src[f"{name}.weight"]) and torch.equal(m.bias, src[f"{name}.bias"])
    hbn = get_model("mobilenet_v2", norm="hbn", num_classes=1000, pretrained=str(path), pretrained_norm="load")
    for name, m in norm_modules(hbn):  # HBN's global statistics are its BN buffers: they start from the checkpoint's
        assert torch.equal(m.global_mean, src[f"{name}.running_mean"]) and torch.equal(m.global_var, src[f"{name}.running_var"])
        assert torch.equal(m.weight, src[f"{name}.weight"]) and torch.equal(m.alpha, torch.zeros_like(m.alpha))
    none = get_model("mobilenet_v2", norm="none", num_classes=1000, pretrained=str(path), pretrained_norm="load")
    assert torch.equal(none.features[18][0].weight, src["features.18.0.weight"]) and not norm_modules(none)


def test_a_form_the_checkpoint_does_not_fit_is_refused_with_the_option_to_use(tmp_path):
    _, path = _export("resnet50", {"stem": "imagenet"}, resnet, tmp_path)
    with pytest.raises(ConfigError, match="stem='imagenet'"):
        get_model("resnet50", num_classes=10, pretrained=str(path))  # CIFAR stem: a 3×3 conv1
    _, path = _export("vgg19", {"classifier": "imagenet"}, vgg, tmp_path)
    with pytest.raises(ConfigError, match="classifier='imagenet'"):
        get_model("vgg19", num_classes=10, pretrained=str(path))
    with pytest.raises(ConfigError, match="not found"):
        get_model("vgg19", pretrained=str(tmp_path / "missing.pth"))
    (tmp_path / "bad.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="could not be read"):
        get_model("vgg19", pretrained=str(tmp_path / "bad.pth"))


TV = [("resnet18", "resnet", "resnet18", resnet), ("resnet50", "resnet", "resnet50", resnet),
      ("vgg11", "vgg", "vgg11_bn", vgg), ("vgg19", "vgg", "vgg19_bn", vgg),
      ("mobilenet_v2", "mobilenetv2", "mobilenet_v2", mobilenet)]


@pytest.mark.parametrize("name,tv_module,tv_builder,module", TV, ids=[t[0] for t in TV])
def test_torchvisions_own_model_loads_and_computes_the_same(name, tv_module, tv_builder, module):
    """With torchvision installed (not a fednorm dependency): its randomly initialised model's state dict
    loads into fednorm's torchvision form, keys one to one, and both give the same logits in eval mode."""
    pytest.importorskip("torchvision")
    tv = getattr(importlib.import_module(f"torchvision.models.{tv_module}"), tv_builder)()
    _randomize_norms(tv)
    state = tv.state_dict()
    kwargs = {f[0]: f[1] for f in FORMS}.get(name, {"classifier": "imagenet"})
    ours = get_model(name, num_classes=1000, pretrained=state, pretrained_norm="load", **kwargs)
    assert {module.from_torchvision_key(k) for k in state} == set(ours.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), tv.eval()(x), rtol=0, atol=0)


def test_paths_expand_the_weights_folder_variable_and_torchvision_names_are_hash_checked(tmp_path, monkeypatch):
    source, path = _export("vgg11", {"classifier": "imagenet"}, vgg, tmp_path)
    monkeypatch.setenv("FEDNORM_WEIGHTS", str(tmp_path))
    loaded = get_model("vgg11", classifier="imagenet", num_classes=1000, pretrained="$FEDNORM_WEIGHTS/vgg11.pth")
    assert torch.equal(loaded.features[0].weight, source.features[0].weight)
    # under torchvision's file name the SHA-256 must start with the digits the name carries (torch.hub's check)
    (tmp_path / "vgg11_bn-6002323d.pth").write_bytes(path.read_bytes())
    with pytest.raises(ConfigError, match="corrupted"):
        get_model("vgg11", classifier="imagenet", pretrained="${FEDNORM_WEIGHTS}/vgg11_bn-6002323d.pth")
