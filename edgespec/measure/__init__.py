"""Measuring on this device: the bench against target-only decoding, the soak, the doctor
report, pair profiles, and a TCP proxy that puts latency on the wire."""
