"""``--quant int4`` on the Hugging Face path: each quantization recipe is tried on the fp32
graph and the one whose graph agrees best with PyTorch on the top-1 token is kept.

Small models lose much at 4 bits, and which recipe loses least depends on the weights
(docs/export.md gives SmolLM2-135M-Instruct's figures). The comparison of every recipe goes
into the manifest (``extra.int4_recipes``); the export's own checks then run on the kept graph
as for any other.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError
from edgespec.events import ProgressEvent, ProgressObserver
from edgespec.export.bundle import logits_width, read_graph_spec
from edgespec.export.onnx_export import GRAPH_FILE
from edgespec.export.quantize import EXTERNAL_DATA_FILE, RECIPES, QuantRequest, quantize_graph
from edgespec.export.verify import GREEDY_TOKENS, PARITY_PROMPTS, check_parity, optimum_driver


def parity_prompts(tokenizer: Any, max_length: int) -> tuple[list[list[int]], int]:
    """The parity prompts as token ids (room left for the greedy continuation) and its length."""
    greedy_tokens = min(GREEDY_TOKENS, max_length // 2)
    prompts = [
        tokenizer(text)["input_ids"][: max_length - greedy_tokens] for text in PARITY_PROMPTS
    ]
    return prompts, greedy_tokens


def choose_recipe(
    fp32_graph: Path,
    staging: Path,
    request: QuantRequest,
    *,
    torch_model: Any,
    tokenizer: Any,
    max_length: int,
    observe: ProgressObserver,
) -> tuple[QuantRequest, list[dict[str, Any]]]:
    """Quantizes ``fp32_graph`` with every recipe, leaves the best one's graph in
    ``staging`` and returns its request and the comparison (one record per recipe)."""
    prompts, greedy_tokens = parity_prompts(tokenizer, max_length)
    records: list[dict[str, Any]] = []
    best: tuple[float, QuantRequest, Path] | None = None
    trials = staging / ".recipes"
    for recipe in RECIPES:
        candidate = replace(request, recipe=recipe)
        folder = trials / recipe
        folder.mkdir(parents=True)
        observe(ProgressEvent(stage="quantize", message=f"int4 recipe {recipe}"))
        try:
            quantize_graph(fp32_graph, folder / GRAPH_FILE, candidate)
        except ExportError as error:  # one recipe failing (HQQ without torch) is not fatal
            records.append({"recipe": recipe, "error": str(error)})
            continue
        spec, weight_bytes = read_graph_spec(folder / GRAPH_FILE)
        driver = optimum_driver(
            folder / GRAPH_FILE,
            spec,
            vocab_size=logits_width(spec, torch_model.config),
            capacity=max_length,
        )
        parity = check_parity(
            driver,
            torch_model,
            prompts,
            exact_dtype=None,
            min_top1_agreement=0.0,
            greedy_tokens=greedy_tokens,
            observe=observe,
        )
        del driver  # the session maps the graph's files
        records.append(
            {
                "recipe": recipe,
                "top1_agreement": parity.top1_agreement,
                "max_abs_logit_diff": parity.max_abs_logit_diff,
                "greedy_match_tokens": parity.greedy_match_tokens,
                "weight_bytes": weight_bytes,
            }
        )
        if best is None or parity.top1_agreement > best[0]:
            best = (parity.top1_agreement, candidate, folder)
    if best is None:
        shutil.rmtree(trials)
        raise ExportError(
            "no int4 recipe could quantize the graph: "
            + "; ".join(f"{r['recipe']}: {r['error']}" for r in records),
            fix="try --quant int8 or fp32",
        )
    _, chosen, folder = best
    for name in (GRAPH_FILE, EXTERNAL_DATA_FILE):
        if (folder / name).exists():
            shutil.move(str(folder / name), str(staging / name))
    shutil.rmtree(trials)
    for record in records:
        record["kept"] = record["recipe"] == chosen.recipe
    return chosen, records
