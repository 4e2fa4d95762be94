"""GGUF (llama.cpp's model files) to ONNX bundles without torch: reader, block weights,
graph builder with an in-place KV cache, tokenizer from metadata, checks, pipeline."""
