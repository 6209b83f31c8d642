"""Vision Transformer (Dosovitskiy et al., 2021): the shared pre-norm TransformerBlock over image
patches. Only the tokenisation differs from a text model.

    image (C, H, W) ─► P x P patches, each flattened and projected to d_model (= a stride-P conv)
      ─► [CLS] + patches, + learned 1-D position embeddings ─► dropout
      ─► L pre-norm blocks (GELU, feed-forward 4H) ─► LayerNorm
      ─► [CLS] state (or the mean of the patch states) ─► linear classifier

`attention="window"` is the Swin Transformer's variant (Liu et al., 2021): attention inside
non-overlapping windows of window_size x window_size patches, every second block with the
windows shifted by half a window (and a mask keeping regions that the cyclic shift brought
together apart), and patch merging (2 x 2 neighbours -> one token of twice the width) between
stages. Pooling is then the mean of the last stage's tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from transformer_lab.models.dropout import Dropout
from transformer_lab.models.blocks import TransformerBlock
from transformer_lab.models.outputs import ModelOutput

# name: (layers, hidden, heads, patch size); tiny is the CPU default for 8x8 digits
SIZES = {
    "tiny": (4, 64, 4, 2),
    "vit-ti/16": (12, 192, 3, 16),
    "vit-s/16": (12, 384, 6, 16),
    "vit-base/16": (12, 768, 12, 16),
    "vit-large/16": (24, 1024, 16, 16),
}


@dataclass
class ViTConfig:
    image_size: int = 8
    in_channels: int = 1
    n_classes: int = 10
    size: str = "tiny"  # fills n_layers, d_model, n_heads, patch_size left at None
    patch_size: int | None = None
    n_layers: int | None = None
    d_model: int | None = None
    n_heads: int | None = None
    d_ff: int | None = None  # None = 4 * d_model
    dropout: float = 0.1
    fast_dropout: bool = True  # cheap CPU dropout masks (models/dropout.py); false: torch's own
    pool: str = "cls"  # cls | mean
    attention: str = "global"  # global | window (Swin)
    window_size: int = 2  # window attention: patches per window side
    stage_depths: list[int] = field(default_factory=list)  # window attention: blocks per stage; [] = [n_layers]
    layer_norm_eps: float = 1e-6

    def __post_init__(self):
        if self.size not in SIZES:
            raise ValueError(f"size={self.size!r}; expected one of {', '.join(SIZES)}")
        layers, hidden, heads, patch = SIZES[self.size]
        self.n_layers = layers if self.n_layers is None else self.n_layers
        self.d_model = hidden if self.d_model is None else self.d_model
        self.n_heads = heads if self.n_heads is None else self.n_heads
        self.patch_size = patch if self.patch_size is None else self.patch_size
        self.d_ff = 4 * self.d_model if self.d_ff is None else self.d_ff
        self.stage_depths = list(self.stage_depths) or [self.n_layers]
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.pool not in ("cls", "mean") or self.attention not in ("global", "window"):
            raise ValueError(f"pool={self.pool!r} (cls | mean), attention={self.attention!r} (global | window)")
        if self.attention == "window":
            grid = self.image_size // self.patch_size
            for stage in range(len(self.stage_depths)):
                if grid % self.window_size:
                    raise ValueError(f"stage {stage}: a {grid}x{grid} patch grid does not split into "
                                     f"{self.window_size}x{self.window_size} windows")
                grid //= 2

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_dict(self) -> dict:
        return asdict(self)


class PatchEmbedding(nn.Module):
    """Cut (batch, C, H, W) into P x P patches in row-major order, flatten each (C, P, P) and
    project it with one linear layer: (batch, H*W/P^2, d_model)."""

    def __init__(self, patch_size: int, in_channels: int, d_model: int):
        super().__init__()
        self.patch_size = patch_size
        self.projection = nn.Linear(in_channels * patch_size * patch_size, d_model)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        batch, channels, _, _ = images.shape
        p = self.patch_size
        grid = images.unfold(2, p, p).unfold(3, p, p)  # (batch, C, H/P, W/P, P, P)
        return grid.permute(0, 2, 3, 1, 4, 5).reshape(batch, -1, channels * p * p)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.projection(self.patches(images))

    def as_convolution(self) -> nn.Conv2d:
        """The same map as a stride-P convolution (how most implementations write it)."""
        d_model, flat = self.projection.weight.shape
        channels = flat // self.patch_size**2
        conv = nn.Conv2d(channels, d_model, self.patch_size, stride=self.patch_size)
        with torch.no_grad():
            conv.weight.copy_(self.projection.weight.view(d_model, channels, self.patch_size, self.patch_size))
            conv.bias.copy_(self.projection.bias)
        return conv


def shifted_window_mask(grid: int, window: int, shift: int, device=None) -> torch.Tensor:
    """(n_windows, window², window²) boolean: may token i of a window attend to token j? After
    the cyclic shift the last windows hold pieces from opposite edges; they stay apart."""
    region = torch.zeros(grid, grid, dtype=torch.long, device=device)
    if shift:
        bounds = (slice(0, grid - window), slice(grid - window, grid - shift), slice(grid - shift, grid))
        for i, rows in enumerate(bounds):
            for j, cols in enumerate(bounds):
                region[rows, cols] = 3 * i + j
    windows = region.view(grid // window, window, grid // window, window).permute(0, 2, 1, 3).reshape(-1, window**2)
    return windows[:, :, None] == windows[:, None, :]


class WindowBlock(nn.Module):
    """A shared TransformerBlock applied within windows of a (batch, grid, grid, d) token map."""

    def __init__(self, block: TransformerBlock, window: int, shift: int):
        super().__init__()
        self.block, self.window, self.shift = block, window, shift

    def forward(self, x: torch.Tensor, *, return_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, grid, _, d = x.shape
        m, per_side = self.window, grid // self.window
        if self.shift:
            x = torch.roll(x, (-self.shift, -self.shift), dims=(1, 2))
        windows = x.view(batch, per_side, m, per_side, m, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, m * m, d)
        mask = shifted_window_mask(grid, m, self.shift, x.device).repeat(batch, 1, 1)[:, None] if self.shift else None
        windows, weights = self.block(windows, return_weights=return_weights, attn_mask=mask)
        x = windows.view(batch, per_side, per_side, m, m, d).permute(0, 1, 3, 2, 4, 5).reshape(batch, grid, grid, d)
        if self.shift:
            x = torch.roll(x, (self.shift, self.shift), dims=(1, 2))
        return x, weights


class PatchMerging(nn.Module):
    """2 x 2 neighbouring tokens -> one token: concatenate (4d), LayerNorm, project to 2d."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(4 * d_model, eps=eps)
        self.reduction = nn.Linear(4 * d_model, 2 * d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        merged = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)
        return self.reduction(self.norm(merged))


class VisionTransformer(nn.Module):
    def __init__(self, config: ViTConfig):
        super().__init__()
        self.config = config
        c = config
        self.patch_embedding = PatchEmbedding(c.patch_size, c.in_channels, c.d_model)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.attention == "global" else None
        n_positions = c.n_patches + (1 if self.cls_token is not None else 0)
        self.position = nn.Parameter(torch.randn(1, n_positions, c.d_model) * 0.02)
        self.dropout = Dropout(c.dropout, fast=c.fast_dropout)

        def block(width: int, heads: int) -> TransformerBlock:
            return TransformerBlock(width, heads, width * c.d_ff // c.d_model, dropout=c.dropout,
                                    activation="gelu", norm_first=True, layer_norm_eps=c.layer_norm_eps,
                                    fast_dropout=c.fast_dropout)

        width = c.d_model
        if c.attention == "global":
            self.blocks = nn.ModuleList(block(width, c.n_heads) for _ in range(c.n_layers))
            self.merges = nn.ModuleList()
        else:
            self.blocks, self.merges = nn.ModuleList(), nn.ModuleList()
            for stage, depth in enumerate(c.stage_depths):
                if stage:
                    self.merges.append(PatchMerging(width, c.layer_norm_eps))
                    width *= 2
                heads = c.n_heads * 2**stage
                self.blocks.append(nn.ModuleList(
                    WindowBlock(block(width, heads), c.window_size, c.window_size // 2 if i % 2 else 0)
                    for i in range(depth)))
        self.final_norm = nn.LayerNorm(width, eps=c.layer_norm_eps)
        self.head = nn.Linear(width, c.n_classes)
        self.apply(_init_weights)

    def forward(self, images: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """images (batch, C, H, W) -> logits: class logits (batch, n_classes); with return_weights,
        attentions: every block's weights (global: (batch, heads, 1 + patches, 1 + patches))."""
        x = self.patch_embedding(images)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        x = self.dropout(x + self.position)
        all_weights = []
        if self.config.attention == "global":
            for block in self.blocks:
                x, weights = block(x, return_weights=return_weights)
                all_weights.append(weights)
            x = self.final_norm(x)
            pooled = x[:, 0] if self.config.pool == "cls" else x[:, 1:].mean(dim=1)
        else:
            grid = self.config.image_size // self.config.patch_size
            x = x.view(len(x), grid, grid, -1)
            for stage, blocks in enumerate(self.blocks):
                if stage:
                    x = self.merges[stage - 1](x)
                for block in blocks:
                    x, weights = block(x, return_weights=return_weights)
                    all_weights.append(weights)
            x = self.final_norm(x).flatten(1, 2)  # the last stage's token map -> (batch, tokens, width)
            pooled = x.mean(dim=1)
        return ModelOutput(logits=self.head(pooled), hidden_states=x,
                           attentions=all_weights if return_weights else None)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
