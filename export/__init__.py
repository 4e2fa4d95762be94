"""Hugging Face causal LM → quantized ONNX bundle with KV-cache I/O (installed as edgespec.export).

Needs the ``[export]`` extra (torch, transformers, optimum-onnx, onnx). Never imported by the
runtime: the two meet only through the bundle directory and its manifest.
"""

from edgespec.export.pipeline import export_bundle

__all__ = ["export_bundle"]
