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
