"""ONNX Runtime engine for speculative decoding (installed as edgespec.runtime).

Reads bundles through ``edgespec.manifest`` only; never imports torch, transformers, optimum,
onnx or ``edgespec.export``. The decoder, sessions and KV cache arrive with the runtime issue.
"""
