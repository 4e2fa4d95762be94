"""Frozen, keyword-only configuration records, validated when they are built."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import ConfigError

#: Quantization choices of ``edgespec export --quant``. ``auto`` resolves to int4 for models
#: of at least ``AUTO_INT4_MIN_PARAMETERS`` parameters and fp32 below that.
QUANT_CHOICES = ("auto", "int4", "int8", "int8-dynamic", "fp16", "fp32")
AUTO_INT4_MIN_PARAMETERS = 100_000_000
#: MatMulNBits accuracy levels: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations.
ACCURACY_LEVELS = (0, 1, 2, 3, 4)


def resolve_quant(quant: str, parameters: int) -> str:
    """Turns ``auto`` into a concrete quantization for a model of ``parameters`` weights."""
    if quant != "auto":
        return quant
    return "int4" if parameters >= AUTO_INT4_MIN_PARAMETERS else "fp32"


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """Everything ``edgespec export`` needs; see ``edgespec export --help`` for each field."""

    model: str
    out: Path
    quant: str = "auto"
    block_size: int = 32
    accuracy_level: int = 4
    max_length: int | None = None
    revision: str = "main"
    force: bool = False
    verify: bool = True
    allow_batch_variance: bool = False
    min_top1_agreement: float = 0.8
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("no model given", fix="pass a hub id or a local model directory")
        if self.quant not in QUANT_CHOICES:
            raise ConfigError(
                f"unknown quantization {self.quant!r}",
                fix=f"use one of {', '.join(QUANT_CHOICES)}",
            )
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ConfigError(
                f"block size {self.block_size} is not a power of two >= 16",
                fix="use 16, 32, 64, 128 or 256",
            )
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise ConfigError(
                f"accuracy level {self.accuracy_level} is not one of {ACCURACY_LEVELS}",
                fix="use 4 (int8 activations, fastest on CPU) or 0/1 (fp32 activations)",
            )
        if self.max_length is not None and self.max_length < 16:
            raise ConfigError(
                f"max length {self.max_length} is too short", fix="use at least 16 tokens"
            )
        if not 0.0 <= self.min_top1_agreement <= 1.0:
            raise ConfigError(
                f"minimum top-1 agreement {self.min_top1_agreement} is outside [0, 1]",
                fix="pass a fraction such as 0.9",
            )


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How the target's (and the draft's) next-token distribution is formed and drawn from.

    ``temperature`` 0 means greedy. ``top_k`` 0 and ``top_p`` 1.0 disable those filters. The
    same transform applies to p_target and q_draft. ``mode`` picks the sampling verification:
    ``rejection`` (Leviathan et al.: output distribution equals the target's) or ``match``
    (the target draws each absolute position from a stream keyed by (seed, position) and drafts
    are accepted while they equal those draws: output token-identical to plain target sampling
    with the same seed).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    mode: str = "rejection"

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ConfigError(
                f"temperature {self.temperature} is negative",
                fix="use 0 for greedy decoding or a positive value such as 0.7",
            )
        if self.top_k < 0:
            raise ConfigError(f"top_k {self.top_k} is negative", fix="use 0 (off) or a count")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(
                f"top_p {self.top_p} is outside (0, 1]", fix="use 1.0 (off) or e.g. 0.9"
            )
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed {self.seed} is outside [0, 2**63)", fix="use e.g. --seed 0")
        if self.mode not in SAMPLING_MODES:
            raise ConfigError(
                f"unknown sampling mode {self.mode!r}",
                fix=f"use one of {', '.join(SAMPLING_MODES)}",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


SAMPLING_MODES = ("rejection", "match")
