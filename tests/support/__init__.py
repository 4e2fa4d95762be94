"""What the test tiers share: tiny models, fake bundles and sysfs trees, GGUF writers, server
processes, the chat's terminal driver, the real-model tier's files and the chi-square check."""
