"""ONNX Runtime engine for speculative decoding (installed as edgespec.runtime).

Reads bundles through ``edgespec.manifest`` only; never imports torch, transformers, optimum,
onnx or ``edgespec.export``. Bottom to top: ``sampling``, ``kv_cache``/``shared_kv``,
``model``, ``acceptance``, ``drafters``, ``verifiers``, ``k_policy``/``costs``/``stats``/``text``,
``decoder``. The engine (``edgespec.engine``, behind ``edgespec.api.Engine``) assembles them.
"""
