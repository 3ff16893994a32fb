"""The BERT-style post-LayerNorm transformer layer, encoder stack and [CLS] pooler."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import UniterConfig
from model.dropout import Dropout, attention, merge_heads

__all__ = ["Encoder", "Pooler", "SelfAttention", "TransformerLayer", "init_bert_weights", "set_dropout"]


def init_bert_weights(module: nn.Module, std: float) -> None:
    """BERT's initialization: N(0, std) for linear/embedding weights, zero biases, unit LayerNorm."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def set_dropout(module: nn.Module, p: float | None) -> None:
    """Set every dropout probability inside ``module`` (each ``nn.Dropout`` and each attention's
    ``dropout_p``) to ``p``; ``None`` puts back the values they had before the first call (the
    model config's). For a phase of training with other dropout; weights and state dict untouched."""
    for m in module.modules():
        name = "p" if isinstance(m, nn.Dropout) else "dropout_p" if isinstance(m, SelfAttention) else None
        if name is None:
            continue
        configured = m.__dict__.setdefault("_configured_dropout", getattr(m, name))
        setattr(m, name, configured if p is None else float(p))


class SelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention`` (while training with
    attention dropout on the CPU: :func:`model.dropout.attention`).

    Q, K and V come from one fused projection (one GEMM instead of three); ``load_bert_weights``
    concatenates BERT's separate query/key/value weights into it.
    """

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.dropout_p = config.attention_dropout
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        """x [B, L, H], attn_mask bool [B, 1, 1, L] (True = key may be attended) -> [B, L, H]."""
        b, length, _ = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(merge_heads(attention(q, k, v, attn_mask, self.dropout_p if self.training else 0.0)))


class TransformerLayer(nn.Module):
    """Post-LN block as in BERT: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        # exact (erf) GELU, as BERT and the MiniLM checkpoint were trained with
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class Encoder(nn.Module):
    """A stack of ``config.num_layers`` transformer layers."""

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_layers))

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """x [B, L, H], key_mask bool [B, L] (True = real position) -> [B, L, H]."""
        attn_mask = key_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attn_mask)
        return x


class Pooler(nn.Module):
    """tanh(Linear(h_[CLS])): the joint image-text representation used by ITM and most tasks."""

    def __init__(self, config: UniterConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """sequence_output [B, L, H] -> [B, H] (from position 0, the [CLS] token)."""
        return torch.tanh(self.dense(sequence_output[:, 0]))
