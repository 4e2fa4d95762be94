"""ONNX Runtime engine for speculative decoding (installed as edgespec.runtime).

Reads bundles through ``edgespec.manifest`` only; never imports torch, transformers, optimum,
onnx or ``edgespec.export``. Bottom to top: ``sampling``, ``model`` (a bundle's session over
``edgespec.graph``'s driver and KV caches, which the exporter's checks share),
``acceptance``, ``drafters``, ``verifiers``, ``k_policy``/``costs``/``stats``/``text``,
``decoder``. The engine (``edgespec.engine``, behind ``edgespec.api.Engine``) assembles them.
"""
