"""Vision Transformers trained from scratch: timm's ``VisionTransformer`` under named presets.

The ``*_cpu`` presets train a few epochs of several thousand 28x28 images in about a minute on two
CPU cores; the others are timm's standard sizes, built through ``timm.create_model`` (no weights).
"""
from __future__ import annotations

import timm
from timm.models.vision_transformer import VisionTransformer

from attent.tasks.vision.config import PRESETS, ViTConfig, vit_config  # noqa: F401  (re-exported)

def build_vit(config: ViTConfig) -> VisionTransformer:
    """A randomly initialised ViT of this shape (timm's registered model when it has the name)."""
    if timm.is_model(config.preset):  # keeps timm's pretrained_cfg metadata; weights stay random
        return timm.create_model(config.preset, pretrained=False, **config.model_kwargs())
    return VisionTransformer(**config.model_kwargs())
