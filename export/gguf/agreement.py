"""A GGUF import's agreement with llama.cpp: its logits of the check prompts against the
graph's, from llama-cpp-python in a child process (a build of it this CPU cannot run costs
the import its figures, never the bundle)."""

from __future__ import annotations

import importlib.util
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.child_process import run_in_child


def llama_cpp_agreement(
    path: Path, prompts: Sequence[Sequence[int]], ours: Sequence[np.ndarray]
) -> dict[str, Any]:
    """Top-1 agreement and max |Δlogit| of ``ours`` (the graph's logits of each prompt) with
    llama.cpp's logits (None figures without it).

    llama.cpp's logits come from one batched ``eval`` per prompt (its prompt path). Its
    one-token path (an ``eval`` per token, as it decodes) rounds differently, so their own
    agreement is recorded beside ours as ``llama_cpp_self_agreement``: the ceiling any
    other engine can be expected to reach. ``disagreement_margin`` is the largest lead
    llama.cpp's top-1 token had over the graph's where the two differ, beside
    ``llama_cpp_self_max_abs_logit_diff``, the most llama.cpp's two paths move a logit: a
    margin below it is a near-tie that llama.cpp's own rounding could tip."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {"checked": False, "reason": "llama-cpp-python is not installed"}
    with tempfile.TemporaryDirectory() as scratch:
        # In a child process: a llama-cpp-python build this CPU cannot run (its AMX kernels
        # where the machine refuses tile instructions) dies of a signal, which must cost the
        # import its agreement figures only, not the bundle.
        child = run_in_child(llama_cpp_logits, str(path), [list(p) for p in prompts], scratch)
        if child.exitcode != 0:
            return {"checked": False, "reason": _llama_cpp_failure(child.exitcode)}
        batched = [np.load(Path(scratch) / f"batched-{i}.npy") for i in range(len(prompts))]
        stepped = [np.load(Path(scratch) / f"one-token-{i}.npy") for i in range(len(prompts))]
    agree, self_agree, positions, diff, self_diff, margin = 0, 0, 0, 0.0, 0.0, 0.0
    for prompt, logits, theirs, one_token in zip(prompts, ours, batched, stepped, strict=True):
        rows, top1, picked = np.arange(len(prompt)), theirs.argmax(-1), logits.argmax(-1)
        agree += int((top1 == picked).sum())
        self_agree += int((top1 == one_token.argmax(-1)).sum())
        positions += len(prompt)
        diff = max(diff, float(np.abs(theirs - logits).max()))
        self_diff = max(self_diff, float(np.abs(theirs - one_token).max()))
        margin = max(margin, float((theirs[rows, top1] - theirs[rows, picked]).max()))
    return {
        "checked": True,
        "top1_agreement": agree / positions,
        "max_abs_logit_diff": diff,
        "llama_cpp_self_agreement": self_agree / positions,
        "disagreement_margin": margin,
        "llama_cpp_self_max_abs_logit_diff": self_diff,
    }


def llama_cpp_logits(path: str, prompts: list[list[int]], out_dir: str) -> None:
    """llama.cpp's logits of each prompt into ``out_dir``: ``batched-{i}.npy`` from one
    ``eval`` of the whole prompt (its prompt path), ``one-token-{i}.npy`` from an ``eval`` per
    token (its decode path); [tokens, vocab] float32 each. Runs in a child process."""
    _without_weight_repacking()
    from llama_cpp import Llama

    # A context just long enough for the prompts: its logits buffer is n_ctx x vocab floats.
    n_ctx = max(64, max(len(prompt) for prompt in prompts))
    llm = Llama(model_path=path, n_ctx=n_ctx, logits_all=True, n_threads=2, verbose=False)
    for i, prompt in enumerate(prompts):
        llm.reset()
        llm.eval(prompt)
        np.save(Path(out_dir) / f"batched-{i}.npy", np.array(llm.scores[: len(prompt)]))
        llm.reset()
        one_token = []
        for token in prompt:
            llm.eval([token])
            one_token.append(np.array(llm.scores[llm.n_tokens - 1], copy=True))
        np.save(Path(out_dir) / f"one-token-{i}.npy", np.stack(one_token))


def _without_weight_repacking() -> None:
    """Loads llama.cpp's model without its repacked copy of the weights (its CPU "extra
    buffer types": Q4_0, Q4_K and others interleaved for its batched kernels, held beside the
    file's mapped pages: docs/benchmarks/export.md, "Importing a GGUF: memory and bundle
    size"), so that this
    check stays inside the import's memory bound. Its logits then come from its plain dot
    products, for the batched and the one-token path alike. Older llama-cpp-python has no
    such field (and repacks less)."""
    try:
        import llama_cpp.llama_cpp as low
    except ImportError:  # a llama-cpp-python laid out otherwise: its defaults stand
        return
    defaults = low.llama_model_default_params
    if "use_extra_bufts" not in {name for name, _ in defaults().__class__._fields_}:
        return

    def without_repacking() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    low.llama_model_default_params = without_repacking


def _llama_cpp_failure(exitcode: int | None) -> str:
    """One line for a child computing llama.cpp's logits that did not finish."""
    if exitcode is not None and exitcode < 0:
        try:
            how = f"died of {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"died of signal {-exitcode}"
    else:
        how = f"exited with status {exitcode}"
    return (
        f"llama-cpp-python {how} computing its logits, so agreement was not measured: a build "
        "this CPU cannot run (llama.cpp's AMX kernels, say); rebuild it portable with "
        "CMAKE_ARGS='-DGGML_NATIVE=OFF' pip install --force-reinstall --no-cache-dir "
        "llama-cpp-python"
    )
