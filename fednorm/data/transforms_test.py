"""Tests for fednorm.data.transforms: the batched fast paths against per-sample references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fednorm.data.transforms import CropFlip, normalize, pixel_value, random_crop_flip


def _images(n: int = 6, h: int = 5, w: int = 7, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, c), dtype=np.uint8)


def _crop_flip_reference(x: torch.Tensor, padding: int, flip: bool, generator: torch.Generator) -> torch.Tensor:
    """Per-sample loop replaying the documented draw order: top (B), left (B), flip (B)."""
    b, _, h, w = x.shape
    top = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    left = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    flips = torch.rand(b, generator=generator) < 0.5 if flip else torch.zeros(b, dtype=torch.bool)
    padded = F.pad(x, (padding,) * 4)
    out = []
    for i in range(b):
        crop = padded[i, :, top[i] : top[i] + h, left[i] : left[i] + w]
        out.append(torch.flip(crop, dims=[-1]) if flips[i] else crop)
    return torch.stack(out) if out else torch.empty_like(x)


def _all_crops(sample: torch.Tensor, padding: int) -> list[torch.Tensor]:
    _, h, w = sample.shape
    padded = F.pad(sample, (padding,) * 4)
    crops = []
    for top in range(2 * padding + 1):
        for left in range(2 * padding + 1):
            crop = padded[:, top : top + h, left : left + w]
            crops += [crop, torch.flip(crop, dims=[-1])]
    return crops


class TestNormalize:
    def test_matches_float64_formula_and_layout(self) -> None:
        x = _images()
        mean, std = (0.1, 0.5, 0.9), (0.2, 0.3, 0.4)
        out = normalize(x, mean, std)
        ref = (x.astype(np.float64) / 255 - np.array(mean)) / np.array(std)
        assert out.dtype == torch.float32 and out.shape == (6, 3, 5, 7) and out.is_contiguous()
        torch.testing.assert_close(out.double(), torch.from_numpy(ref.transpose(0, 3, 1, 2)), atol=1e-5, rtol=1e-6)

    def test_tensor_input_and_single_channel(self) -> None:
        x = torch.from_numpy(_images(c=1))
        out = normalize(x, [0.5], [0.25])
        torch.testing.assert_close(out, (x.permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25)

    def test_non_contiguous_input(self) -> None:
        x = _images(n=8)[::2]
        torch.testing.assert_close(normalize(x, [0.0] * 3, [1.0] * 3), normalize(x.copy(), [0.0] * 3, [1.0] * 3))

    def test_empty_batch(self) -> None:
        assert normalize(_images(n=0), [0.0] * 3, [1.0] * 3).shape == (0, 3, 5, 7)

    def test_rejects_bad_inputs(self) -> None:
        with pytest.raises(TypeError, match="uint8"):
            normalize(_images().astype(np.float32), [0.0] * 3, [1.0] * 3)
        with pytest.raises(ValueError, match="4D"):
            normalize(_images()[0], [0.0] * 3, [1.0] * 3)
        with pytest.raises(ValueError, match="one value per channel"):
            normalize(_images(), [0.0], [1.0])
        with pytest.raises(ValueError, match="positive"):
            normalize(_images(), [0.0] * 3, [1.0, 0.0, 1.0])


class TestRandomCropFlip:
    def test_identity_without_padding_or_flip(self) -> None:
        x = torch.randn(5, 3, 8, 8)
        out = random_crop_flip(x, padding=0, flip=False, generator=torch.Generator().manual_seed(0))
        assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()

    def test_flipped_samples_equal_torch_flip(self) -> None:
        x = torch.randn(64, 2, 4, 6)
        out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(1))
        same = [torch.equal(out[i], x[i]) for i in range(len(x))]
        flipped = [torch.equal(out[i], torch.flip(x[i], dims=[-1])) for i in range(len(x))]
        assert all(s != f for s, f in zip(same, flipped))  # exactly one holds per sample
        assert 10 < sum(flipped) < 54  # p = 0.5: both cases occur (P(fail) < 1e-6)

    def test_each_sample_is_a_crop_of_the_padded_input(self) -> None:
        x = torch.randn(12, 3, 5, 5)
        out = random_crop_flip(x, padding=2, generator=torch.Generator().manual_seed(2))
        for i in range(len(x)):
            assert any(torch.equal(out[i], crop) for crop in _all_crops(x[i], 2)), f"sample {i}"

    def test_matches_per_sample_reference_exactly(self) -> None:
        x = torch.randn(32, 3, 6, 4)
        out = random_crop_flip(x, padding=3, generator=torch.Generator().manual_seed(3))
        ref = _crop_flip_reference(x, 3, True, torch.Generator().manual_seed(3))
        torch.testing.assert_close(out, ref, rtol=0, atol=0)

    @settings(max_examples=40, deadline=None)
    @given(
        b=st.integers(0, 5),
        c=st.integers(1, 3),
        h=st.integers(1, 6),
        w=st.integers(1, 6),
        padding=st.integers(0, 4),
        flip=st.booleans(),
        seed=st.integers(0, 2**31 - 1),
    )
    def test_reference_on_random_shapes(
        self, b: int, c: int, h: int, w: int, padding: int, flip: bool, seed: int
    ) -> None:
        x = torch.randn(b, c, h, w, generator=torch.Generator().manual_seed(seed))
        out = random_crop_flip(x, padding=padding, flip=flip, generator=torch.Generator().manual_seed(seed))
        ref = _crop_flip_reference(x, padding, flip, torch.Generator().manual_seed(seed))
        assert out.shape == x.shape
        torch.testing.assert_close(out, ref, rtol=0, atol=0)

    def test_same_seed_same_output_and_generator_advances(self) -> None:
        x = torch.randn(16, 3, 8, 8)
        g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        a, b = random_crop_flip(x, generator=g1), random_crop_flip(x, generator=g2)
        assert torch.equal(a, b)
        assert not torch.equal(random_crop_flip(x, generator=g1), a)  # state moved on

    def test_offsets_cover_the_whole_range(self) -> None:
        # An impulse at the centre reveals each sample's offset: it lands at (h-1-top+p, ...).
        p, size = 2, 5
        x = torch.zeros(400, 1, size, size)
        x[:, :, size // 2, size // 2] = 1.0
        out = random_crop_flip(x, padding=p, flip=False, generator=torch.Generator().manual_seed(4))
        positions = {tuple(idx.tolist()) for idx in out[:, 0].flatten(1).argmax(1).unsqueeze(1)}
        assert len(positions) == (2 * p + 1) ** 2

    def test_keeps_dtype_and_zero_pads(self) -> None:
        x = torch.full((8, 3, 4, 4), 200, dtype=torch.uint8)
        out = random_crop_flip(x, padding=4, generator=torch.Generator().manual_seed(5))
        assert out.dtype == torch.uint8
        assert set(out.unique().tolist()) <= {0, 200}

    def test_black_fill_is_the_code_order_crop_then_normalize(self) -> None:
        """crop_fill black: normalising, then cropping with pixel_value(0) as the fill, equals
        torchvision's order (pad with black and crop the uint8 image, then Normalize), exactly."""
        mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
        images = _images(n=40, h=6, w=5, c=3, seed=7)
        out = random_crop_flip(normalize(images, mean, std), padding=3, generator=torch.Generator().manual_seed(8),
                               fill=pixel_value(0, mean, std))
        cropped = _crop_flip_reference(torch.from_numpy(images).permute(0, 3, 1, 2), 3, True, torch.Generator().manual_seed(8))
        ref = normalize(cropped.permute(0, 2, 3, 1).contiguous(), mean, std)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        assert (out == torch.tensor(pixel_value(0, mean, std)).view(1, 3, 1, 1)).any()  # some border was drawn
        np.testing.assert_allclose(pixel_value(0, mean, std), [-m / s for m, s in zip(mean, std)], rtol=1e-6)

    def test_crop_flip_object_applies_its_padding_and_fill(self) -> None:
        x = torch.randn(16, 2, 4, 4, dtype=torch.float64)
        aug = CropFlip(2, (-3.0, 5.0))
        torch.testing.assert_close(aug(x, torch.Generator().manual_seed(9)),
                                   random_crop_flip(x, padding=2, generator=torch.Generator().manual_seed(9), fill=(-3.0, 5.0)),
                                   rtol=0, atol=0)

    def test_rejects_bad_inputs(self) -> None:
        with pytest.raises(ValueError, match="one value per channel"):
            random_crop_flip(torch.zeros(1, 3, 4, 4), padding=1, fill=(0.0, 1.0))
        with pytest.raises(ValueError, match="4D"):
            random_crop_flip(torch.zeros(3, 4, 4))
        with pytest.raises(ValueError, match="padding"):
            random_crop_flip(torch.zeros(1, 1, 4, 4), padding=-1)
