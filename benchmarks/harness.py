"""What the benchmark scripts share: their common flags, configurations taking turns in one
process, timed passes, medians and rates, JSON lines, the output-equality check, and the
servers they start (llama.cpp's ``llama-server``, ``edgespec serve``).

A script here runs as ``python benchmarks/NAME.py``, so this folder is first on ``sys.path``
and ``import harness`` finds this module. The module itself needs only the standard library
(``llama_cpp_cuda.py`` runs where edgespec is not installed); the timed passes import
:mod:`edgespec.runtime.costs` when called. The servers are ``tests/support/processes.py``'s,
the launcher the test tiers use.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # support.processes

from support.processes import LlamaServerProcess, ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: Seconds of quiet before a run when engines alternate: both engines' threads spin for a
#: while after a run, and a run started meanwhile is slowed
#: (docs/benchmarks/smollm2-vs-llama-cpp.md).
SETTLE_S = 0.25
#: Passes dropped at the start of a block: the previous block's threads still spin.
WARM_PASSES = 5

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 (an item: a prompt, a context length)


# --- flags --------------------------------------------------------------------------------


def description(doc: str | None, part: str = "line") -> str:
    """A script's ``--help`` description from its docstring: its first ``line``, first
    ``paragraph``, or ``all`` of it."""
    text = doc or ""
    if part == "line":
        return text.splitlines()[0] if text else ""
    return text.split("\n\n")[0] if part == "paragraph" else text


def argument_parser(
    doc: str | None,
    *,
    part: str = "line",
    bundles: str | None = None,
    threads: int | None = None,
    rounds: int | None = None,
    repeats: int | None = None,
    prompts: int | None = None,
    tokens: int | None = None,
    context: int | None = None,
    contexts: str | None = None,
    seed: int | None = None,
    json_out: bool = False,
    jsonl: bool = True,
) -> argparse.ArgumentParser:
    """A parser with the flags the scripts share; each given value is that flag's default
    (None leaves the flag out). ``bundles``: the positional bundle paths, ``nargs`` as given
    (``"+"``). ``json_out``: ``--json OUT`` for a script's whole report; ``jsonl``:
    ``--jsonl OUT``, where :class:`JsonLines` appends every record it prints."""
    parser = argparse.ArgumentParser(description=description(doc, part))
    if bundles is not None:
        parser.add_argument("bundles", type=Path, nargs=bundles, help="bundle directories")
    flags: list[tuple[str, Any, type, str]] = [
        ("--threads", threads, int, "intra-op threads"),
        ("--rounds", rounds, int, "rounds of the configurations taking turns"),
        ("--repeats", repeats, int, "times each measurement repeats"),
        ("--prompts", prompts, int, "prompts per set"),
        ("--tokens", tokens, int, "new tokens per generation"),
        ("--context", context, int, "tokens of context before the timed passes"),
        ("--contexts", contexts, str, "context lengths, comma-separated"),
        ("--seed", seed, int, "random seed"),
    ]
    for flag, default, kind, text in flags:
        if default is not None:
            parser.add_argument(flag, type=kind, default=default, help=f"{text} ({default})")
    if json_out:
        parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="the report")
    if jsonl:
        parser.add_argument(
            "--jsonl", type=Path, default=None, metavar="OUT", help="append every record here"
        )
    return parser


def int_list(text: str) -> list[int]:
    """``"64,1024,3000"`` -> ``[64, 1024, 3000]``."""
    return [int(part) for part in text.split(",") if part]


def readme_text(copies: int = 1) -> str:
    """This repository's README, ``copies`` times: the scripts' long context."""
    return README.read_text(encoding="utf-8") * copies


# --- configurations taking turns ----------------------------------------------------------


@dataclass(frozen=True)
class Turn(Generic[I, T]):
    """One item's results: every configuration's, in the order they ran."""

    round: int
    index: int
    item: I
    results: dict[str, T]


def alternate(
    configs: Sequence[str],
    items: Sequence[I],
    run: Callable[[str, I], T],
    *,
    rounds: int = 1,
    settle_s: float = 0.0,
    rotate: bool = False,
) -> Iterator[Turn[I, T]]:
    """Runs ``run(config, item)`` for every item, every configuration in turn on each item
    (A, B, C, A, B, C, ...), ``rounds`` times, in this one process: a slow stretch of a busy
    machine slows every configuration alike. ``settle_s``: seconds of quiet before each run;
    ``rotate``: shift the order item by item, so that no configuration always runs first."""
    for round_index in range(rounds):
        for index, item in enumerate(items):
            order = list(configs)
            if rotate and order:
                shift = (index + round_index) % len(order)
                order = order[shift:] + order[:shift]
            results: dict[str, T] = {}
            for config in order:
                if settle_s:
                    time.sleep(settle_s)
                results[config] = run(config, item)
            yield Turn(round_index, index, item, results)


def settled(run: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``run(*args, **kwargs)`` after :data:`SETTLE_S` of quiet."""
    time.sleep(SETTLE_S)
    return run(*args, **kwargs)


# --- medians, rates, output equality ------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """Order statistics of one configuration's samples."""

    count: int
    median: float
    least: float
    mean: float
    p25: float
    p75: float


def summarize(values: Sequence[float]) -> Summary:
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else []
    low, high = (quartiles[0], quartiles[2]) if quartiles else (values[0], values[0])
    return Summary(
        count=len(values),
        median=statistics.median(values),
        least=min(values),
        mean=statistics.mean(values),
        p25=low,
        p75=high,
    )


@dataclass
class Samples:
    """Samples by key (a configuration, or a (configuration, context) pair)."""

    by_key: dict[Hashable, list[float]] = field(default_factory=dict)

    def add(self, key: Hashable, *values: float) -> None:
        self.by_key.setdefault(key, []).extend(values)

    def __getitem__(self, key: Hashable) -> list[float]:
        return self.by_key[key]

    def median(self, key: Hashable) -> float:
        return statistics.median(self.by_key[key])

    def mean(self, key: Hashable) -> float:
        return statistics.mean(self.by_key[key])

    def summary(self, key: Hashable) -> Summary:
        return summarize(self.by_key[key])


@dataclass
class Rates:
    """Tokens and seconds summed by configuration: a set's rate is its tokens over its
    seconds (long answers weigh more than short ones, as in a user's wait)."""

    tokens: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, config: str, tokens: float, seconds: float) -> None:
        self.tokens[config] = self.tokens.get(config, 0) + tokens
        self.seconds[config] = self.seconds.get(config, 0.0) + seconds

    def rate(self, config: str) -> float:
        return self.tokens[config] / self.seconds[config]

    def rates(self) -> dict[str, float]:
        return {config: self.rate(config) for config in self.tokens}

    def ratios(self, base: str) -> dict[str, float]:
        return {config: rate / self.rate(base) for config, rate in self.rates().items()}


@dataclass
class OutputCheck:
    """Whether each configuration's output equals the ``reference`` configuration's on the
    same item (speculative greedy output must be target-only greedy output, token for token),
    counted over the items added."""

    reference: str
    items: int = 0
    identical: dict[str, int] = field(default_factory=dict)

    def add(self, outputs: Mapping[str, Sequence[int]]) -> dict[str, bool]:
        """Each configuration's verdict on one item; ``outputs``: config -> tokens."""
        expected = list(outputs[self.reference])
        same = {config: list(tokens) == expected for config, tokens in outputs.items()}
        self.items += 1
        for config, equal in same.items():
            self.identical[config] = self.identical.get(config, 0) + equal
        return same

    def all_equal(self, config: str | None = None) -> bool:
        """Whether ``config`` (else every configuration) equalled the reference every time."""
        chosen = [config] if config else list(self.identical)
        return all(self.identical.get(name, 0) == self.items for name in chosen)

    def fraction(self, config: str) -> str:
        return f"{self.identical.get(config, 0)}/{self.items}"


@dataclass(frozen=True)
class JsonLines:
    """Prints records as JSON lines (flushed) and appends them to ``path`` when one is set
    (``--jsonl``); ``echo=False`` keeps a record off the screen (a script whose screen is a
    table)."""

    path: Path | None = None

    def write(self, record: Mapping[str, Any], *, echo: bool = True) -> None:
        line = json.dumps(record, default=str)
        if echo:
            print(line, flush=True)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(line + "\n")


# --- timed passes (edgespec.runtime.costs) ------------------------------------------------


def timed_passes(
    model: Any, cache: Any, step: Sequence[int], *, length: int, passes: int, warm: int = 0
) -> list[float]:
    """Seconds of ``passes`` passes of ``step`` over ``cache`` (cropped back to ``length``
    after each), less the first ``warm``."""
    from edgespec.runtime.costs import pass_times

    return pass_times(model, cache, step, length=length, passes=passes)[warm:]


def step_blocks(
    models: Mapping[str, Any],
    context: Sequence[int],
    *,
    blocks: int,
    passes: int,
    warm: int = 0,
    step: Sequence[int] = (42,),
) -> dict[str, list[float]]:
    """Seconds of passes of ``step`` after ``context``, each cropped back: each model's
    cache is filled once, then the models take turns in blocks of ``passes`` passes (the
    first ``warm`` of a block dropped), ``blocks`` times."""
    caches = {}
    for name, model in models.items():
        caches[name] = model.new_cache()
        model.forward(list(context), caches[name])
    found: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(blocks):
        for name, model in models.items():
            found[name] += timed_passes(
                model, caches[name], step, length=len(context), passes=passes, warm=warm
            )
    return found


def verify_curve(
    model: Any, context: Sequence[int], widths: Sequence[int], repeats: int
) -> dict[int, float]:
    """The median seconds of a pass of each width after ``context``, the widths taking turns
    (:func:`edgespec.runtime.costs.width_times`)."""
    from edgespec.runtime.costs import width_times

    times = width_times(model, context, widths, repeats)
    return {width: statistics.median(found) for width, found in zip(widths, times, strict=True)}


# --- servers ------------------------------------------------------------------------------


def llama_server(binary: Path, args: list[str], *, start_timeout_s: float = 300.0) -> Any:
    """llama.cpp's ``llama-server`` with ``args`` on a free loopback port: a context manager
    (``with llama_server(...) as server: server.url``) that starts it, waits until its
    ``/health`` answers, and stops it; its log lies in the temporary directory."""
    return LlamaServerProcess(binary, args, port=free_port(), start_timeout_s=start_timeout_s)


def edgespec_server(extra: list[str], *, start_timeout_s: float = 600.0) -> ServerProcess:
    """``edgespec serve`` with ``extra`` arguments on a free loopback port (a context manager,
    as :func:`llama_server`), run outside the checkout as a deployment runs it."""
    port = free_port()
    command = [sys.executable, "-m", "edgespec", "serve", "--port", str(port), *extra]
    return ServerProcess(command, port=port, start_timeout_s=start_timeout_s)


def post(url: str, body: Mapping[str, Any], timeout: float = 600) -> dict[str, Any]:
    """``POST url`` with a JSON body; the JSON reply."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply: dict[str, Any] = json.loads(response.read())
        return reply


def llama_completion(
    url: str, prompt: str | list[int], tokens: int, *, temperature: float = 0.0
) -> dict[str, Any]:
    """One ``/completion`` on a llama-server, its prompt cache off (a run of its own): greedy
    (``top_k`` 1) unless ``temperature``, no other sampler. The tokens, the decode rate
    (``predicted_per_second``: the prompt excluded) and the drafted and accepted counts."""
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": temperature,
        "top_k": 1 if temperature == 0 else 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "seed": 0,
        "cache_prompt": False,
        "return_tokens": True,
    }
    reply = post(url + "/completion", body)
    timings = reply["timings"]
    return {
        "tokens": [int(t) for t in reply.get("tokens", [])],
        "new_tokens": int(timings["predicted_n"]),
        "tok_s": float(timings["predicted_per_second"]),
        "drafted": timings.get("draft_n"),
        "accepted": timings.get("draft_n_accepted"),
    }
