"""Masked autoencoders over one or several image modalities, from timm's ViT parts.

    MultiModalEncoder   one timm PatchEmbed per modality (semseg: class embedding first) into a
                        shared stack of timm Blocks; fixed 2D sin-cos positions + a learned
                        embedding per modality. Sees only the visible tokens when pretraining,
                        every RGB token downstream.
    ModalityDecoder     light, one per modality (MultiMAE): the encoded context, projected, and
                        that modality's N query tokens (mask tokens where hidden), either through
                        a few Blocks together (``joint``) or, as MultiMAE's, the queries attending
                        to the context once, then a few Blocks of their own (``cross_attention``);
                        a linear head predicts each patch's pixels (semseg: class logits, at
                        ``semseg_stride`` times fewer pixels a side: MultiMAE's 56 x 56 maps);
                        MultiMAE's extra ``norm_rgb`` decoder reads RGB's slots.
    MaskedAutoencoder   encoder + decoders; returns each decoder's per-patch predictions.

MAE is the one-modality case (RGB) with a fixed mask ratio.
"""

from __future__ import annotations

import torch
from timm.layers import Mlp, PatchEmbed, trunc_normal_
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models.vision_transformer import Block
from torch import nn

from attent.tasks.mae.config import MaskedAutoencoderSpec
from attent.tasks.mae.files import IGNORE_INDEX

SEMSEG = "semseg"


def sincos_positions(grid: int, dim: int) -> torch.Tensor:
    return build_sincos2d_pos_embed([grid, grid], dim=dim).unsqueeze(0)  # [1, N, dim]


def semseg_at(labels: torch.Tensor, stride: int) -> torch.Tensor:
    """Class ids [B, H, W] at ``stride`` times fewer pixels a side (nearest: every stride-th pixel),
    the size semseg enters the encoder and is predicted at."""
    return labels if stride == 1 else labels[:, ::stride, ::stride]


class SemSegEmbed(nn.Module):
    """Class ids -> a learned embedding per pixel -> patches (MultiMAE's semseg input adapter, at
    ``semseg_stride``)."""

    def __init__(self, spec: MaskedAutoencoderSpec):
        super().__init__()
        self.classes, self.stride = spec.semseg_classes, spec.semseg_stride
        self.class_embed = nn.Embedding(spec.semseg_classes + 1, spec.class_embed_dim)  # +1: ignore
        size, patch = spec.img_size // self.stride, spec.pixel_patch(SEMSEG)
        self.patch_embed = PatchEmbed(size, patch, spec.class_embed_dim, spec.embed_dim)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        labels = semseg_at(labels, self.stride)
        labels = torch.where(labels == IGNORE_INDEX, self.classes, labels)
        return self.patch_embed(self.class_embed(labels).permute(0, 3, 1, 2))


class CrossAttention(nn.Module):
    """Queries attending to a context once, then an MLP (MultiMAE's output adapter's first layer: no
    residual around the attention, whose output replaces the queries)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.query_norm, self.context_norm, self.out_norm = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = Mlp(dim, 4 * dim)

    def forward(self, queries: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        context = self.context_norm(context)
        x = self.attention(self.query_norm(queries), context, context, need_weights=False)[0]
        return x + self.mlp(self.out_norm(x))


class MultiModalEncoder(nn.Module):
    def __init__(self, spec: MaskedAutoencoderSpec):
        super().__init__()
        self.spec = spec
        self.embeds = nn.ModuleDict(
            {
                m: SemSegEmbed(spec)
                if m == SEMSEG
                else PatchEmbed(spec.img_size, spec.patch_size, spec.channels(m), spec.embed_dim)
                for m in spec.modalities
            }
        )
        self.modality_embed = nn.Parameter(torch.zeros(len(spec.modalities), 1, spec.embed_dim))
        # MultiMAE's global tokens: no position, in every attention, never a patch's output
        self.global_tokens = (
            nn.Parameter(torch.zeros(1, spec.global_tokens, spec.embed_dim)) if spec.global_tokens else None
        )
        self.register_buffer("pos_embed", sincos_positions(spec.grid, spec.embed_dim), persistent=False)
        rates = torch.linspace(0, spec.drop_path_rate, spec.depth, device="cpu").tolist()  # a meta build too
        self.blocks = nn.Sequential(
            *[Block(spec.embed_dim, spec.num_heads, spec.mlp_ratio, qkv_bias=True, drop_path=rate) for rate in rates]
        )
        self.norm = nn.LayerNorm(spec.embed_dim)
        trunc_normal_(self.modality_embed, std=0.02)
        if self.global_tokens is not None:
            trunc_normal_(self.global_tokens, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return {"modality_embed", "global_tokens"}

    def tokens(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """All patch tokens, modality after modality: [B, M * N, D]."""
        return torch.cat(
            [
                self.embeds[m](inputs[m]) + self.pos_embed + self.modality_embed[i]
                for i, m in enumerate(self.spec.modalities)
            ],
            dim=1,
        )

    def forward(
        self, inputs: dict[str, torch.Tensor], visible: torch.Tensor | None = None, *, with_global: bool = False
    ) -> torch.Tensor:
        """Encoded tokens [B, n, D]: the ``visible`` token ids only (None: every token), then the
        global tokens where ``with_global`` (they take part either way)."""
        x = self.tokens(inputs)
        if visible is not None:
            x = x.gather(1, visible[:, :, None].expand(-1, -1, x.shape[-1]))
        patches = x.shape[1]
        if self.global_tokens is not None:
            x = torch.cat([x, self.global_tokens.expand(x.shape[0], -1, -1)], dim=1)
        x = self.norm(self.blocks(x))
        return x if with_global else x[:, :patches]


class ModalityDecoder(nn.Module):
    def __init__(self, spec: MaskedAutoencoderSpec, modality: str):
        super().__init__()
        dim = spec.decoder_dim
        self.register_buffer("query_pos", sincos_positions(spec.grid, dim), persistent=False)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.cross = CrossAttention(dim, spec.decoder_heads) if spec.decoder == "cross_attention" else None
        self.blocks = nn.Sequential(
            *[Block(dim, spec.decoder_heads, 4.0, qkv_bias=True) for _ in range(spec.decoder_depth)]
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, spec.pixel_patch(modality) ** 2 * spec.channels(modality))
        trunc_normal_(self.mask_token, std=0.02)

    def forward(self, context: torch.Tensor, own: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """context [B, n, d]: every visible token; own [B, N, d]: this modality's slots (its
        visible tokens in place, zeros elsewhere); hidden [B, N]. Returns [B, N, p*p*C]."""
        queries = torch.where(hidden[:, :, None], self.mask_token.to(own.dtype), own) + self.query_pos
        if self.cross is None:
            x = self.blocks(torch.cat([context, queries], dim=1))[:, context.shape[1] :]
        else:
            x = self.blocks(self.cross(queries, context))
        return self.head(self.norm(x))


class MaskedAutoencoder(nn.Module):
    def __init__(self, spec: MaskedAutoencoderSpec):
        super().__init__()
        self.spec = spec
        self.encoder = MultiModalEncoder(spec)
        self.to_decoder = nn.Linear(spec.embed_dim, spec.decoder_dim)
        self.decoder_modality = nn.Parameter(torch.zeros(len(spec.modalities), 1, spec.decoder_dim))
        self.decoders = nn.ModuleDict({name: ModalityDecoder(spec, name) for name in spec.outputs})
        trunc_normal_(self.decoder_modality, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return {"modality_embed", "global_tokens", "decoder_modality", "mask_token"}

    def forward(
        self, inputs: dict[str, torch.Tensor], visible: torch.Tensor, hidden: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Per-patch predictions of every decoder (``spec.outputs``), {name: [B, N, p*p*C]}."""
        spec = self.spec
        context = self.to_decoder(self.encoder(inputs, visible, with_global=True))  # [B, n + globals, d]
        encoded = context[:, : visible.shape[1]] + self.decoder_modality[visible // spec.patches, 0]
        context = torch.cat([encoded, context[:, visible.shape[1] :]], dim=1)
        slots = encoded.new_zeros(encoded.shape[0], len(spec.modalities) * spec.patches, encoded.shape[-1])
        slots = slots.scatter(1, visible[:, :, None].expand(-1, -1, encoded.shape[-1]), encoded)
        out = {}
        for name in spec.outputs:
            i = spec.modalities.index(spec.source(name))
            span = slice(i * spec.patches, (i + 1) * spec.patches)
            out[name] = self.decoders[name](context, slots[:, span], hidden[:, span])
        return out


def patchify(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, N, p*p*C] (row-major patches, pixels then channels)."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // patch, patch, w // patch, patch)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(b, (h // patch) * (w // patch), patch * patch * c)


def unpatchify(patches: torch.Tensor, patch: int, channels: int) -> torch.Tensor:
    """[B, N, p*p*C] -> [B, C, H, W], the inverse of ``patchify``."""
    b, n, _ = patches.shape
    grid = int(round(n**0.5))
    x = patches.reshape(b, grid, grid, patch, patch, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(b, channels, grid * patch, grid * patch)


class DownstreamModel(nn.Module):
    """An encoder over RGB with a task head: pooled tokens -> class logits, or each token -> its
    patch's pixels (semseg logits, depth in metres), optionally refined by a 3x3 conv."""

    def __init__(
        self,
        spec: MaskedAutoencoderSpec,
        target: str,
        outputs: int,
        head_hidden: int | None = None,
        typical_depth: float = 1.0,
    ):
        super().__init__()
        self.spec, self.target, self.outputs = spec, target, outputs
        # depth = exp(head + log_depth): log_depth starts at the data's typical depth (metres),
        # so the head learns relative depth instead of first climbing to the right scale.
        self.log_depth = nn.Parameter(torch.tensor(float(typical_depth)).log()) if target == "depth" else None
        self.encoder = MultiModalEncoder(spec)
        dim = spec.embed_dim
        if target == "classification":
            self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, outputs))
            self.refine = None
        else:
            self.head = nn.Linear(dim, spec.patch_size**2 * (head_hidden or outputs))
            self.refine = (
                None
                if head_hidden is None
                else nn.Sequential(nn.GELU(), nn.Conv2d(head_hidden, outputs, kernel_size=3, padding=1))
            )
        self.hidden = head_hidden or outputs

    def no_weight_decay(self) -> set[str]:
        return {"encoder.modality_embed", "encoder.global_tokens"}

    def forward(self, rgb: torch.Tensor) -> torch.Tensor:
        tokens = self.encoder({"rgb": rgb})
        if self.target == "classification":
            return self.head(tokens.mean(dim=1))
        dense = unpatchify(self.head(tokens), self.spec.patch_size, self.hidden)
        if self.refine is not None:
            dense = self.refine(dense)
        return torch.exp((dense + self.log_depth).clamp(-10, 10)) if self.target == "depth" else dense


def rgb_encoder_state(state: dict[str, torch.Tensor], modalities: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A (multi-modal) encoder's state dict cut down to the RGB input: RGB's patch embedding and
    modality embedding, every block, the final norm."""
    if "rgb" not in modalities:
        raise ValueError(f"the pretrained encoder has no RGB input (modalities {list(modalities)})")
    out = {}
    for key, value in state.items():
        if key.startswith("embeds.") and not key.startswith("embeds.rgb."):
            continue
        out[key] = value[modalities.index("rgb") :][:1] if key == "modality_embed" else value
    return out
