"""What vLLM computes for hybrid rounds: prompt tokens per round and per generated token from its
``/metrics``, by history length and block size, against the block model.

    python benchmarks/vllm_rounds.py --model-dir HF_DIR [--blocks 32,128] [--histories 60,1500]
        [--k 4] [--tokens 48]

vLLM's CPU build (``tools/install_vllm.sh``) serves ``HF_DIR`` (``tools/hf_dir_from_gguf.py``
of SmolLM2-135M-Instruct's GGUF) once per block size; the shipped SmolLM2 draft drafts on this
machine at a fixed k, greedy. For each history length the script reads vLLM's counters
before and after one generation: prompt tokens sent (``vllm:prompt_tokens_total``), those its
prefix cache held (``vllm:prefix_cache_hits_total``), and so the tokens it computed; per
round after the history's own first computation (one copy: the first round's prompts share
it), beside the block model at the starting history, (k + 1) * (history mod block) +
(k + 1)(k + 2) / 2 tokens a round (vLLM caches whole blocks only; the history grows as the
generation runs, so the model is a guide, not a bound). Every output is compared with vLLM's
own greedy output. Counts, not times: they do not depend on what else the machine runs.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import harness
from support.processes import VllmServer, free_port  # on sys.path through harness

CODE = "def f(x):\n    return x + 1\n\n"


def counters(url: str) -> tuple[float, float]:
    sent = hits = 0.0
    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("vllm:prompt_tokens_total"):
            sent += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
    return sent, hits


def vllm_greedy(url: str, model: str, prompt: list[int], tokens: int) -> list[int]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    named = harness.post(url + "/v1/completions", body)["choices"][0]["logprobs"]["tokens"]
    return [int(str(token).split(":")[1]) for token in named]


def main() -> None:
    parser = harness.argument_parser(__doc__, jsonl=False)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--blocks", type=harness.int_list, default=[32, 128])
    parser.add_argument("--histories", type=harness.int_list, default=[60, 1500])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    from edgespec.api import Engine
    from edgespec.models.bundles import draft_bundle
    from edgespec.models.catalog import default_model

    draft = draft_bundle(default_model())
    assert draft is not None
    rows = []
    for block in args.blocks:
        server = VllmServer(
            model=args.model_dir, port=free_port(), block_size=block, max_model_len=4096
        )
        with server:
            engine = Engine.load(draft=draft.root, remote=server.url, measure_energy=False)
            for history_length in args.histories:
                history = engine.encode(CODE * (history_length // 8 + 1))[:history_length]
                before = counters(server.url)
                result = engine.generate(
                    history, max_new_tokens=args.tokens, k=args.k, drafter="model"
                )
                sent, hits = (a - b for a, b in zip(counters(server.url), before, strict=True))
                computed = sent - hits
                rounds = result.stats.rounds
                model = (args.k + 1) * (history_length % block) + (args.k + 1) * (args.k + 2) / 2
                expected = vllm_greedy(server.url, args.model_dir.name, history, len(result.tokens))
                row = {
                    "block": block,
                    "history": history_length,
                    "k": args.k,
                    "rounds": rounds,
                    "new_tokens": len(result.tokens),
                    "alpha": round(result.stats.alpha, 3),
                    "computed": computed,
                    "cached": hits,
                    "computed_per_new_token": round(computed / max(len(result.tokens), 1), 1),
                    "computed_per_round": round((computed - len(history)) / rounds, 1),
                    "block_model": model,
                    "identical": list(result.tokens) == expected,
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(json.dumps({"summary": rows}))


if __name__ == "__main__":
    main()
