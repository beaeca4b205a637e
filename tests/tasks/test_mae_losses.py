"""The semseg reconstruction loss against its definition, pixel by pixel: each sample's mean
cross-entropy over the labelled pixels of its hidden patches (unlabelled pixels and visible patches
count nothing), whatever the batch beside it."""

from __future__ import annotations

import math

import torch
from attent.tasks.mae.files import IGNORE_INDEX
from attent.tasks.mae.losses import semseg_loss


def test_semseg_loss_is_each_samples_mean_cross_entropy_over_its_hidden_labelled_pixels():
    generator = torch.Generator().manual_seed(0)
    b, size, patch, classes = 3, 8, 4, 5
    n = (size // patch) ** 2
    labels = torch.randint(0, classes, (b, size, size), generator=generator)
    labels[0, :2] = IGNORE_INDEX  # unlabelled rows of the first patch row
    pred = torch.randn(b, n, patch * patch * classes, generator=generator)
    hidden = torch.tensor([[1.0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]])
    expected = []
    for s in range(b):
        total, count = 0.0, 0
        for index in range(n):
            row, col = divmod(index, size // patch)
            if not hidden[s, index]:
                continue
            for pixel in range(patch * patch):
                y, x = row * patch + pixel // patch, col * patch + pixel % patch
                label = int(labels[s, y, x])
                if label == IGNORE_INDEX:
                    continue
                logits = pred[s, index, pixel * classes : (pixel + 1) * classes].double()
                total += float(torch.logsumexp(logits, 0) - logits[label])
                count += 1
        expected.append(total / count)
    got = semseg_loss(pred, labels, hidden, patch, classes)
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5)  # float32 sums
    alone = semseg_loss(pred[1:2], labels[1:2], hidden[1:2], patch, classes)
    assert math.isclose(float(alone), float(got[1]), rel_tol=1e-6)


def test_multimaes_semseg_enters_and_leaves_at_a_quarter_of_the_image_and_is_scored_there():
    from attent.tasks.mae.config import MaskedModelConfig
    from attent.tasks.mae.losses import reconstruction_losses
    from attent.tasks.mae.masking import random_masks
    from attent.tasks.mae.model import MaskedAutoencoder, semseg_at

    shape = {"preset": "vit_tiny_cpu", "patch_size": 8, "decoder_dim": 32, "decoder_depth": 2, "decoder_heads": 4}
    spec = MaskedModelConfig(**shape, semseg_stride=4, decoder="cross_attention").spec(("rgb", "semseg"), 32, 5)
    model = MaskedAutoencoder(spec)
    assert model.encoder.embeds["semseg"].patch_embed.img_size == (8, 8)  # 32 px / 4: MultiMAE's 56 at 224
    assert model.decoders["semseg"].cross is not None and model.decoders["rgb"].cross is not None
    labels = torch.randint(0, 5, (2, 32, 32), generator=torch.Generator().manual_seed(0))
    batch = {"rgb": torch.randn(2, 3, 32, 32), "semseg": labels}
    masks = random_masks(2, 2, spec.patches, 8, alpha=1.0)
    predictions = model(batch, masks.visible, masks.hidden)
    assert predictions["semseg"].shape == (2, spec.patches, (8 // 4) ** 2 * 5)  # 2 x 2 pixels a patch, 5 logits each
    # logits that put every pixel of the quarter-size map on its label: no semseg loss left
    small = semseg_at(labels, 4)
    perfect = 50.0 * torch.nn.functional.one_hot(patchify_labels(small, 2), 5).flatten(2).float()
    losses = reconstruction_losses(
        {"rgb": predictions["rgb"], "semseg": perfect}, batch, masks.hidden, spec=spec, norm_pix=True
    )
    assert losses[:, 1].max() < 1e-6 < losses[:, 0].min()
    joint = MaskedModelConfig(**shape).spec(("rgb", "semseg"), 32, 5)
    assert joint.semseg_stride == 1 and MaskedAutoencoder(joint).decoders["semseg"].cross is None  # today's


def patchify_labels(labels: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, H, W] class ids -> [B, N, p*p], row-major patches (``model.patchify`` for ids)."""
    from attent.tasks.mae.model import patchify

    return patchify(labels[:, None].float(), patch).long()


def test_multimaes_extra_decoder_adds_the_normalised_rgb_loss_to_rgbs_and_its_global_token_is_in_the_context():
    """MultiMAE's defaults: RGB's loss is its decoder's on the plain pixels plus the extra decoder's on
    each patch standardised; a global token every decoder's context holds, never a patch's output."""
    from attent.tasks.mae.config import MaskedModelConfig
    from attent.tasks.mae.losses import reconstruction_losses, rgb_loss
    from attent.tasks.mae.masking import random_masks
    from attent.tasks.mae.model import MaskedAutoencoder

    shape = {"preset": "vit_tiny_cpu", "patch_size": 8, "decoder_dim": 32, "decoder_heads": 4, "global_tokens": 1}
    spec = MaskedModelConfig(**shape, decoder="cross_attention").spec(("rgb", "depth"), 32, extra_norm_pix=True)
    model = MaskedAutoencoder(spec)
    batch = {"rgb": torch.randn(3, 3, 32, 32), "depth": torch.rand(3, 1, 32, 32) + 0.5}
    masks = random_masks(3, 2, spec.patches, 6, alpha=1.0)
    predictions = model(batch, masks.visible, masks.hidden)
    assert set(predictions) == {"rgb", "depth", "norm_rgb"} and predictions["norm_rgb"].shape == (3, 16, 8 * 8 * 3)
    losses = reconstruction_losses(predictions, batch, masks.hidden, spec=spec, norm_pix=False)
    rgb_hidden = masks.hidden[:, : spec.patches].float()
    plain = rgb_loss(predictions["rgb"], batch["rgb"], rgb_hidden, 8, norm_pix=False)
    normalised = rgb_loss(predictions["norm_rgb"], batch["rgb"], rgb_hidden, 8, norm_pix=True)
    assert losses.shape == (3, 2) and torch.allclose(losses[:, 0], plain + normalised)
    assert not torch.allclose(plain, normalised)
    losses.sum().backward()
    assert model.encoder.global_tokens.grad.abs().sum() > 0  # it reaches the losses through the context
    assert model.encoder(batch, masks.visible).shape[1] == masks.visible.shape[1]  # patches only, by default
