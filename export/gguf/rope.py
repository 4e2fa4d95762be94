"""Rotary angles as llama.cpp computes them from a GGUF file's metadata.

Beyond the base frequencies ``theta^(-2i / D)``, a file may carry:

- frequency factors (``rope_freqs.weight``, [D / 2] float32): Llama 3.1 and 3.2 store their
  "llama3" rope scaling this way; llama.cpp divides pair i's frequency by factor i (Llama
  files only: its Qwen and Gemma graphs pass no factors);
- Phi-3's long and short factors (``rope_factors_long``/``_short``): llama.cpp rotates by
  the long ones where its context is longer than the original one, so a graph takes the set
  its capacity calls for (:meth:`RopeScaling.for_context`), with the file's ``attn_factor``;
- a scaling type (``{arch}.rope.scaling.type``) and factor: ``linear`` multiplies every
  frequency by 1 / factor; ``yarn`` blends those interpolated frequencies with the original
  ones over a ramp of dimensions set by the original context length, and scales cos and sin
  by its magnitude factor (1 + 0.1 ln factor, as llama.cpp applies it).

Everything here ends in the cos and sin tables the graphs and the numpy reference read, so
the graph is the same whatever the scaling. A file without any of these gets the same tables,
bit for bit, as before scaling was read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import UnsupportedModelError

#: The scaling types the importer runs (llama.cpp's names); "longrope" (Phi-3) is not one.
SCALING_TYPES = ("none", "linear", "yarn")
#: llama.cpp's YaRN defaults where the file names none.
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """How a file's rotary frequencies depart from ``theta^(-2i / D)``; the default is none."""

    kind: str = "none"
    #: The context stretch: frequencies times 1 / factor (linear; YaRN's interpolated ones).
    factor: float = 1.0
    #: YaRN: the context the model was trained at before stretching, its ramp's bounds
    #: (beta_fast, beta_slow rotations), its blend (ext_factor) and cos/sin magnitude.
    original_context: int = 0
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW
    ext_factor: float = 0.0
    magnitude: float = 1.0
    #: Per-pair divisors of the frequencies (``rope_freqs.weight``); empty when none.
    frequency_factors: tuple[float, ...] = ()
    #: What to call it where the factors carry a scaling of another name (a Hugging Face
    #: checkpoint's "llama3 x8", its frequencies taken from transformers).
    label: str = ""
    #: Phi-3's factors for contexts past ``original_context`` (``frequency_factors`` holds
    #: its short ones) until :meth:`for_context` picks a set; empty otherwise.
    long_frequency_factors: tuple[float, ...] = ()

    def for_context(self, context: int) -> RopeScaling:
        """The scaling of a graph of ``context`` positions: Phi-3's long factors past the
        original context, its short ones within it (llama.cpp's choice by its context size)."""
        if not self.long_frequency_factors:
            return self
        long = context > self.original_context
        return replace(
            self,
            frequency_factors=self.long_frequency_factors if long else self.frequency_factors,
            long_frequency_factors=(),
            label=f"longrope, {'long' if long else 'short'} factors",
        )

    @property
    def describe(self) -> str:
        """A few words for the export summary and the manifest ("none" when unscaled)."""
        if self.label:
            return self.label
        parts = [] if self.kind == "none" else [f"{self.kind} x{self.factor:g}"]
        if self.frequency_factors:
            parts.append("frequency factors")
        return ", ".join(parts) or "none"


NO_SCALING = RopeScaling()


def read_rope_scaling(
    path: Path,
    arch: str,
    fields: dict[str, Any],
    tensors: dict[str, Any],
    *,
    head_dim: int,
    rotated: int,
    context_length: int,
) -> RopeScaling:
    """The file's rotary scaling as llama.cpp reads it (``rotated``: the dimensions of each
    head it rotates, the first ones); one-line refusals for what it is not."""
    from edgespec.export.gguf.reader import field_value, float_tensor

    def value(key: str, default: Any = None) -> Any:
        return field_value(fields, f"{arch}.{key}", default)

    if rotated % 2 or not 0 < rotated <= head_dim:
        raise UnsupportedModelError(
            f"{path.name} rotates {rotated} of each head's {head_dim} dimensions; llama.cpp "
            "rotates an even number of them, at most the head's",
            fix="re-convert the model with a current llama.cpp converter",
        )
    # llama.cpp: the type defaults to linear, a missing or zero factor to 1 (no stretch).
    kind = str(value("rope.scaling.type", "linear"))
    if kind not in SCALING_TYPES:
        raise UnsupportedModelError(
            f"{path.name} uses {kind!r} rotary scaling; the importer runs "
            f"{', '.join(SCALING_TYPES)}",
            fix="use a model without that scaling (a shorter-context variant, say)",
        )
    factor = float(value("rope.scaling.factor", 0.0) or value("rope.scale_linear", 0.0) or 0.0)
    if kind == "none" or factor in (0.0, 1.0):
        kind, factor = "none", 1.0

    def factors_of(name: str) -> tuple[float, ...]:
        found = float_tensor(tensors[name]).reshape(-1)
        if found.shape != (rotated // 2,) or not np.all(found > 0):
            raise UnsupportedModelError(
                f"{path.name} has a {name} of shape {tuple(found.shape)}; llama.cpp "
                f"expects {rotated // 2} positive frequency factors",
                fix="re-convert the model with a current llama.cpp converter",
            )
        return tuple(float(f) for f in found)

    factors: tuple[float, ...] = ()
    if arch == "llama" and "rope_freqs.weight" in tensors:
        factors = factors_of("rope_freqs.weight")
    attention_factor = float(value("rope.scaling.attn_factor", 1.0) or 1.0)
    if arch == "phi3" and "rope_factors_long.weight" in tensors:
        return RopeScaling(
            original_context=int(value("rope.scaling.original_context_length", context_length)),
            magnitude=attention_factor,
            frequency_factors=factors_of("rope_factors_short.weight"),
            long_frequency_factors=factors_of("rope_factors_long.weight"),
        )
    if kind != "yarn":
        return RopeScaling(
            kind=kind, factor=factor, magnitude=attention_factor, frequency_factors=factors
        )
    log_multiplier = float(value("rope.scaling.yarn_log_multiplier", 0.0) or 0.0)
    magnitude = _yarn_magnitude(factor, 1.0)
    if log_multiplier:
        magnitude /= _yarn_magnitude(factor, log_multiplier)
    return RopeScaling(
        kind=kind,
        factor=factor,
        original_context=int(value("rope.scaling.original_context_length", 0) or context_length),
        beta_fast=float(value("rope.scaling.yarn_beta_fast", YARN_BETA_FAST)),
        beta_slow=float(value("rope.scaling.yarn_beta_slow", YARN_BETA_SLOW)),
        ext_factor=float(value("rope.scaling.yarn_ext_factor", 1.0)),
        magnitude=magnitude * attention_factor,
        frequency_factors=factors,
    )


def _yarn_magnitude(factor: float, multiplier: float) -> float:
    """YaRN's attention magnitude for a stretch of ``factor`` (1 at no stretch)."""
    return 1.0 if factor <= 1.0 else 0.1 * multiplier * math.log(factor) + 1.0


def _yarn_ramp(scaling: RopeScaling, head_dim: int, theta: float) -> np.ndarray:
    """Each pair's share of the original (extrapolated) frequency, [D / 2]: 1 for the pairs
    that turn more than beta_fast times over the original context, 0 below beta_slow turns,
    linear between (llama.cpp's correction dimensions, floored and ceiled)."""

    def dimension(rotations: float) -> float:
        turns = scaling.original_context / (rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(theta))

    low = max(0.0, math.floor(dimension(scaling.beta_fast)))
    high = min(head_dim - 1.0, math.ceil(dimension(scaling.beta_slow)))
    pairs = np.arange(head_dim // 2, dtype=np.float64)
    return (1.0 - np.clip((pairs - low) / max(0.001, high - low), 0.0, 1.0)) * scaling.ext_factor


def base_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """Each pair's unscaled frequency theta^(-2i / D), [D / 2] float64."""
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rotary_caches(
    *, head_dim: int, theta: float, capacity: int, scaling: RopeScaling = NO_SCALING
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [capacity, head_dim / 2] of llama.cpp's rope over ``head_dim`` rotated
    dimensions (a head's first ones where it rotates only part): angle p * theta^(-2i / D),
    each pair's frequency divided by its factor, then scaled as ``scaling`` says (Phi-3's
    factor sets picked for ``capacity`` where the caller has not picked them)."""
    scaling = scaling.for_context(capacity)
    inverse = base_frequencies(head_dim, theta)
    if scaling.frequency_factors:
        inverse = inverse / np.asarray(scaling.frequency_factors, dtype=np.float64)
    if scaling.kind == "linear":
        inverse = inverse / scaling.factor
    elif scaling.kind == "yarn":
        share = _yarn_ramp(scaling, head_dim, theta)
        inverse = inverse / scaling.factor * (1.0 - share) + inverse * share
    angles = np.arange(capacity, dtype=np.float64)[:, None] * inverse[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    if scaling.magnitude != 1.0:
        cos, sin = cos * scaling.magnitude, sin * scaling.magnitude
    return cos.astype(np.float32), sin.astype(np.float32)


def layer_tables(caches: dict[str, str], arch: Any, layer: int) -> tuple[str, str]:
    """The cos and sin tables ``layer`` rotates by (``arch`` a GGUFArchitecture): identity
    ones for a layer without rotary embedding (SmolLM3's every fourth: cos 1, sin 0 leave Q and
    K exactly as they are), a sliding-window layer's local ones, else the global ones."""
    if not arch.rotates(layer):
        return caches["identity_cos"], caches["identity_sin"]
    if arch.is_sliding(layer):
        return caches["local_cos"], caches["local_sin"]
    return caches["cos"], caches["sin"]


def rotary_constants(builder: Any, arch: Any, capacity: int) -> dict[str, str]:
    """The graph's rotary tables [capacity, turned / 2] as constants, by the names
    :func:`layer_tables` reads: the global ones, a sliding-window layer's (its own base,
    unscaled), and the identity for layers without rotary embedding."""
    cos, sin = rotary_caches(
        head_dim=arch.rotated_dims,
        theta=arch.rope_theta,
        capacity=capacity,
        scaling=arch.rope_scaling,
    )
    caches = {
        "cos": builder.constant("rotary.cos", cos),
        "sin": builder.constant("rotary.sin", sin),
    }
    if arch.sliding_window:
        local_cos, local_sin = rotary_caches(
            head_dim=arch.rotated_dims, theta=arch.local_rope_theta, capacity=capacity
        )
        caches["local_cos"] = builder.constant("rotary.local_cos", local_cos)
        caches["local_sin"] = builder.constant("rotary.local_sin", local_sin)
    if arch.no_rope_every:
        caches["identity_cos"] = builder.constant("rotary.identity_cos", np.ones_like(cos))
        caches["identity_sin"] = builder.constant("rotary.identity_sin", np.zeros_like(sin))
    return caches
