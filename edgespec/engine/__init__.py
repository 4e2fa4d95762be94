"""The engine's parts, split by lifetime: loading a pair, the options of one generation,
planning it, the assembly of drafter, verifier and k policy from one registry each, and the
generation."""
