"""Vision Transformers of named shapes, shared by the tasks that build them (vision classifies
with timm's ``VisionTransformer``; MAE builds its encoder from the same shapes).

The ``*_cpu`` presets train a few epochs of several thousand 28x28 images in about a minute on two
CPU cores; the others are timm's standard sizes, built through ``timm.create_model`` (no weights).
The shapes are plain data, so configs validate them without importing torch; ``build_vit``
imports timm when it builds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Architecture of each preset; a ViTConfig adds the data's shape and any overrides.
PRESETS: dict[str, dict[str, Any]] = {
    "vit_tiny_cpu": dict(patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
    "vit_small_cpu": dict(patch_size=4, embed_dim=96, depth=6, num_heads=4, mlp_ratio=2.0),
    "vit_tiny_patch16_224": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0),
    "vit_small_patch16_224": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0),
    "vit_base_patch16_224": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
}


@dataclass(frozen=True)
class ViTConfig:
    """A named preset and the shape it resolves to (timm ``VisionTransformer`` arguments)."""

    preset: str
    img_size: int
    patch_size: int
    in_chans: int
    num_classes: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float
    drop_path_rate: float = 0.0

    def __post_init__(self):
        if self.img_size % self.patch_size:
            raise ValueError(
                f"patch_size={self.patch_size} does not divide img_size="
                f"{self.img_size}; pick a patch size that divides the image size"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"num_heads={self.num_heads} does not divide embed_dim="
                f"{self.embed_dim}; pick a head count that divides the width"
            )
        if not 0.0 <= self.drop_path_rate < 1.0:
            raise ValueError(f"drop_path_rate={self.drop_path_rate} must be in [0, 1)")

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for timm's VisionTransformer."""
        return {k: v for k, v in asdict(self).items() if k != "preset"}


def vit_config(preset: str, *, img_size: int, in_chans: int, num_classes: int, **overrides: Any) -> ViTConfig:
    """The preset's architecture for this data, with overrides (patch_size, depth, ...) on top."""
    if preset not in PRESETS:
        raise ValueError(f"unknown ViT preset {preset!r}; choose one of {sorted(PRESETS)}")
    return ViTConfig(
        preset=preset, img_size=img_size, in_chans=in_chans, num_classes=num_classes, **{**PRESETS[preset], **overrides}
    )


def build_vit(config: ViTConfig):
    """A randomly initialised timm ``VisionTransformer`` of this shape (timm's registered model
    when it has the name)."""
    import timm
    from timm.models.vision_transformer import VisionTransformer

    if timm.is_model(config.preset):  # keeps timm's pretrained_cfg metadata; weights stay random
        return timm.create_model(config.preset, pretrained=False, **config.model_kwargs())
    return VisionTransformer(**config.model_kwargs())
