"""Remote targets: a target verified over HTTP, on ``edgespec serve`` or a serving engine.

- :mod:`.transport`: the HTTP connection (deadlines, retries, traffic) under every target.
- :mod:`.target`: the protocols a remote target and an OpenAI-compatible engine implement.
- :mod:`.registry`: the targets by the protocol they speak, and "auto" (asked of the URL).
- one module per engine: :mod:`.edgespec_server` (protocol v1), :mod:`.llama_server`,
  :mod:`.vllm`, :mod:`.echo` (engines that echo prompts with log-probabilities), the last
  three behind :class:`.openai.OpenAITarget`, whose ``ENGINES`` finds which one answers.
- shared by engines: :mod:`.prompt_batch` (verification by batched prompts), :mod:`.pieces`
  (the draft tokenizer's token texts), :mod:`.vocabulary` (the tokenizer check).
"""
