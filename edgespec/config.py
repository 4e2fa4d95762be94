"""Frozen, keyword-only configuration records, validated when they are built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


ATTENTION_CHOICES = ("auto", "kernel", "plain")
KERNEL_CHOICES = ("auto", "gguf", "mlas")
KV_CACHE_CHOICES = ("auto", "float16", "float32")


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
    #: The system message a conversation gets when it has none (recorded in the manifest).
    system_prompt: str | None = None
    #: Hugging Face checkpoints: "inplace" (Llama, Qwen2), "optimum" (every architecture), or
    #: "auto": inplace where it applies.
    graph: str = "auto"
    #: In-place graphs: "kernel" (edgespec's CacheAttention, on the GGUF kernels only: a row's
    #: bits at any pass width, a sliding window's hidden positions never read), "plain" (ONNX
    #: Runtime's GroupQueryAttention), or "auto": kernel on the GGUF kernels, else plain
    #: (:mod:`edgespec.export.gguf.attention` says which serves what).
    attention: str = "auto"
    #: GGUF imports: "auto" and "gguf" run every weight type the kernels read (Q4_0 ... Q8_0,
    #: Q2_K ... Q6_K, IQ4_NL, IQ4_XS) on edgespec's GGUF kernels, as the file's blocks, where
    #: this install built them; "mlas" runs none (ONNX Runtime's MatMulNBits).
    kernels: str = "auto"
    #: The KV cache's type: "float16" (half the memory; edgespec's CacheAttention kernel
    #: only), "float32", or "auto": float16 where that kernel attends, else float32.
    kv_cache: str = "auto"
    #: More ``Manifest.extra`` entries (``edgespec distill`` records its training there).
    extra: dict[str, Any] = field(default_factory=dict)

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
        if self.kernels not in KERNEL_CHOICES:
            raise ConfigError(
                f"unknown kernels {self.kernels!r}",
                fix=f"use one of {', '.join(KERNEL_CHOICES)}",
            )
        if self.kv_cache not in KV_CACHE_CHOICES:
            raise ConfigError(
                f"unknown KV cache type {self.kv_cache!r}",
                fix=f"use one of {', '.join(KV_CACHE_CHOICES)}",
            )
        if self.attention == "folded":
            raise ConfigError(
                "attention 'folded' is no longer an export form (plain attention serves graphs "
                "without the GGUF kernels)",
                fix="leave --attention at auto, or use kernel or plain",
            )
        if self.attention not in ATTENTION_CHOICES:
            raise ConfigError(
                f"unknown attention form {self.attention!r}",
                fix=f"use one of {', '.join(ATTENTION_CHOICES)}",
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
    (the target draws each absolute position by a race of Exp(1) variables keyed by (seed,
    position, token id) and drafts are accepted while they equal those draws: output
    token-identical to plain target sampling with the same seed).
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


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """Budgets the engine stays inside (None: no budget of that kind).

    ``memory_mb`` is checked at load (admission from the manifests) and watched while
    generating (RSS); ``power_w`` and ``energy_per_token_j`` are watched from the energy
    source; below ``min_battery_pct`` on battery, speculation stops (or verification moves to
    a remote target, when one is configured). ``hold_s`` is the least time between two changes
    of the budget policy's mode, and a condition counts as recovered only ``hysteresis``
    (a fraction) below its budget, so the policy does not flap. ``check_every_s`` spaces the
    probe reads between rounds.
    """

    memory_mb: float | None = None
    power_w: float | None = None
    energy_per_token_j: float | None = None
    min_battery_pct: float | None = None
    hold_s: float = 2.0
    hysteresis: float = 0.15
    check_every_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("memory_mb", "power_w", "energy_per_token_j"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"budget {name} is {value}", fix="use a positive value or None")
        if self.min_battery_pct is not None and not 0 <= self.min_battery_pct <= 100:
            raise ConfigError(
                f"min_battery_pct {self.min_battery_pct} is outside [0, 100]",
                fix="use a percentage such as 20",
            )
        if not 0.0 <= self.hysteresis < 1.0:
            raise ConfigError(
                f"hysteresis {self.hysteresis} is outside [0, 1)", fix="use e.g. 0.15"
            )
        if self.hold_s < 0 or self.check_every_s < 0:
            raise ConfigError("hold_s and check_every_s must be >= 0", fix="use e.g. 2.0 and 0.1")

    @property
    def watches_anything(self) -> bool:
        return any(
            value is not None
            for value in (
                self.memory_mb,
                self.power_w,
                self.energy_per_token_j,
                self.min_battery_pct,
            )
        )
