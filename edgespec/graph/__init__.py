"""Running an exported graph, shared by the runtime and the exporters' checks (which may not
import each other): the KV caches and their :class:`~edgespec.graph.kv_cache.KVCache` protocol
(``kv_cache``), the four forward paths (``paths``), passes cut at attention boundaries
(``passes``) and :class:`~edgespec.graph.driver.GraphDriver`, which picks a path once.
Imports numpy and onnxruntime only (besides the bundle's records)."""
