"""The head in torch, for training: one decoder layer over [embedding of the next token ; the
target's feature], predicting the target's next feature, scored by the target's own final norm
and output rows over a reduced vocabulary (EAGLE-1's drafter, at the target's layer shape).

Everything here computes what :mod:`edgespec.export.head.graph` builds in ONNX: Llama's block
(RMSNorm, rotate-half rotary attention with grouped KV heads, SwiGLU MLP), no biases, the
target's final norm and rows frozen. Shapes: B sequences, S positions, H hidden, N kept tokens.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, kw_only=True)
class HeadShape:
    """A head's sizes: the target's hidden size, attention heads and head size, the MLP
    width, the reduced vocabulary (``vocabulary`` kept tokens; row N of the embedding is the
    zero row every other token looks up), the rotary base and the norm's epsilon."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocabulary: int
    rope_theta: float
    rms_norm_eps: float

    def record(self) -> dict[str, Any]:
        return asdict(self)


def head_net(
    shape: HeadShape,
    *,
    table: np.ndarray,
    output: np.ndarray | None = None,
    norm: np.ndarray,
    seed: int,
) -> Any:
    """A :class:`HeadNet` (torch) whose frozen ``table`` [N + pad, H] (the target's embedding
    rows of the kept tokens, then zeros) embeds tokens, ``output`` (the target's output rows
    of them; None: ``table``, a tied target's) scores them, and ``norm`` [H] is the target's
    final norm weight."""
    import torch

    torch.manual_seed(seed)
    scoring = torch.from_numpy(table if output is None else output)
    return _head_class()(shape, torch.from_numpy(table), scoring, torch.from_numpy(norm))


def _head_class() -> Any:
    import torch
    from torch import nn
    from torch.nn import functional

    def rms_norm(x: Any, weight: Any, eps: float) -> Any:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    class HeadNet(nn.Module):
        def __init__(self, shape: HeadShape, table: Any, scoring: Any, norm: Any) -> None:
            super().__init__()
            self.shape = shape
            h, d = shape.hidden, shape.head_dim
            self.register_buffer("table", table.float(), persistent=False)  # [N + pad, H]
            self.register_buffer("scoring", scoring.float(), persistent=False)  # [N + pad, H]
            self.register_buffer("final_norm", norm.float(), persistent=False)  # [H]
            # [x_emb ; feature] -> H; starts as the feature itself (the identity on its half),
            # so an untrained head predicts "the next feature is this one".
            self.fc = nn.Linear(2 * h, h, bias=False)
            with torch.no_grad():
                self.fc.weight.zero_()
                self.fc.weight[:, h:] = torch.eye(h)
                self.fc.weight[:, :h].normal_(std=0.02)
            self.attn_norm = nn.Parameter(torch.ones(h))
            self.q = nn.Linear(h, shape.heads * d, bias=False)
            self.k = nn.Linear(h, shape.kv_heads * d, bias=False)
            self.v = nn.Linear(h, shape.kv_heads * d, bias=False)
            self.o = nn.Linear(shape.heads * d, h, bias=False)
            self.ffn_norm = nn.Parameter(torch.ones(h))
            self.gate = nn.Linear(h, shape.intermediate, bias=False)
            self.up = nn.Linear(h, shape.intermediate, bias=False)
            self.down = nn.Linear(shape.intermediate, h, bias=False)
            for linear in (self.q, self.k, self.v, self.gate, self.up):
                nn.init.normal_(linear.weight, std=0.02)
            for linear in (self.o, self.down):  # residual branches start closed
                nn.init.zeros_(linear.weight)
            inverse = 1.0 / shape.rope_theta ** (torch.arange(0, d, 2).float() / d)  # [D / 2]
            self.register_buffer("inverse_frequency", inverse, persistent=False)

        def buffer(self, name: str) -> Any:
            """One of the frozen tensors (the table, the scoring rows, the final norm)."""
            return self.get_buffer(name)

        def frequencies(self) -> Any:
            return self.get_buffer("inverse_frequency")

        def rotary(self, x: Any, positions: Any) -> Any:
            """Rotate-half rotary embedding of x [B, heads, S, D] at ``positions`` [S]."""
            angles = positions.float()[:, None] * self.frequencies()[None, :]  # [S, D / 2]
            cos = torch.cat([angles.cos(), angles.cos()], -1)
            sin = torch.cat([angles.sin(), angles.sin()], -1)
            half = x.shape[-1] // 2
            rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
            return x * cos + rotated * sin

        def project(self, ids: Any, features: Any) -> Any:
            """The layer's input [B, S, H]: fc([table[ids] ; features])."""
            return self.fc(torch.cat([self.buffer("table")[ids], features], -1))

        def qkv(self, x: Any, positions: Any) -> tuple[Any, Any, Any]:
            """Q [B, heads, S, D] and K, V repeated to the query heads, rotated at
            ``positions`` [S]."""
            shape, (batch, length, _) = self.shape, x.shape
            normed = rms_norm(x, self.attn_norm, shape.rms_norm_eps)
            d = shape.head_dim
            q = self.q(normed).view(batch, length, shape.heads, d).transpose(1, 2)
            k = self.k(normed).view(batch, length, shape.kv_heads, d).transpose(1, 2)
            v = self.v(normed).view(batch, length, shape.kv_heads, d).transpose(1, 2)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
            groups = shape.heads // shape.kv_heads
            return q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

        def finish(self, x: Any, attended: Any) -> Any:
            """The residual stream after attention's output [B, heads, S, D] and the MLP."""
            batch, length, _ = x.shape
            x = x + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
            normed = rms_norm(x, self.ffn_norm, self.shape.rms_norm_eps)
            return x + self.down(functional.silu(self.gate(normed)) * self.up(normed))

        def unrolled(self, tokens: Any, features: Any, depth: int, *, drafted: bool) -> list[Any]:
            """The head's predictions at chain depths 1..``depth`` from every position, as the
            runtime drafts them: tokens [B, L] (reduced ids of x_0..x_{L-1}) and the target's
            features [B, L, H] (f_0..f_{L-1}).

            Depth 1 reads the true pairs (x_{t+1}, f_t) at positions t = 0..L-2, causally; its
            output at t predicts f_{t+1} (and so x_{t+2}). Depth j > 1 of branch t sits at
            position t + j - 1 with the token x_{t+j} (``drafted``: the head's own argmax at
            depth j - 1) and the depth j - 1 prediction as its feature; it attends to the true
            pairs 0..t and to its own branch's earlier depths, as the head's cache holds them
            while it drafts (EAGLE-3's training-time test). Returns [B, L - j, H] per depth j:
            row t predicts f_{t+j}."""
            length = tokens.shape[1]
            x = self.project(tokens[:, 1:], features[:, :-1])  # [B, T, H], T = L - 1
            positions = torch.arange(length - 1, device=features.device)
            q, k_true, v_true = self.qkv(x, positions)
            scale = 1.0 / float(self.shape.head_dim) ** 0.5
            attended = functional.scaled_dot_product_attention(q, k_true, v_true, is_causal=True)
            predicted = [self.finish(x, attended)]
            chain: list[tuple[Any, Any]] = []
            for j in range(2, depth + 1):
                n = length - j  # branches t = 0..n-1 reach f_{t+j}
                if n < 1:
                    break
                previous = predicted[-1][:, :n]
                ids = self.logits(previous).argmax(-1) if drafted else tokens[:, j : j + n]
                x = self.project(ids, previous)
                q, k, v = self.qkv(x, positions[:n] + j - 1)
                chain = [(ck[:, :, :n], cv[:, :, :n]) for ck, cv in chain] + [(k, v)]
                # [B, heads, n, T]: branch t sees the true pairs at positions 0..t.
                scores = (q @ k_true.transpose(-1, -2)) * scale
                allowed = torch.ones(n, length - 1, dtype=torch.bool).tril()
                scores = scores.masked_fill(~allowed, float("-inf"))
                own = torch.stack([(q * ck).sum(-1) * scale for ck, _ in chain], -1)
                weights = torch.softmax(torch.cat([scores, own], -1), -1)
                true_weights, own_weights = weights[..., : length - 1], weights[..., length - 1 :]
                attended = true_weights @ v_true
                for i, (_, cv) in enumerate(chain):
                    attended = attended + own_weights[..., i : i + 1] * cv
                predicted.append(self.finish(x, attended))
            return predicted

        def logits(self, features: Any) -> Any:
            """Scores [.., N] of the kept tokens from features [.., H], as the target scores
            them: its final norm, then its rows."""
            normed = rms_norm(features, self.buffer("final_norm"), self.shape.rms_norm_eps)
            return normed @ self.buffer("scoring")[: self.shape.vocabulary].T

    return HeadNet


def gguf_tensors(net: Any) -> dict[str, np.ndarray]:
    """The trained weights as float32 under llama.cpp's names ([rows, columns]); the head's
    own ``head_fc.weight`` [H, 2H] beside them. The rotary embedding stays rotate-half (the
    graph is built with NeoX rotary), so no Q/K rows are permuted."""
    names = {
        "attn_norm": "blk.0.attn_norm.weight",
        "q.weight": "blk.0.attn_q.weight",
        "k.weight": "blk.0.attn_k.weight",
        "v.weight": "blk.0.attn_v.weight",
        "o.weight": "blk.0.attn_output.weight",
        "ffn_norm": "blk.0.ffn_norm.weight",
        "gate.weight": "blk.0.ffn_gate.weight",
        "up.weight": "blk.0.ffn_up.weight",
        "down.weight": "blk.0.ffn_down.weight",
        "fc.weight": "head_fc.weight",
    }
    state = net.state_dict()
    return {names[key]: state[key].detach().float().cpu().numpy() for key in names}
