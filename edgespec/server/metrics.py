"""``GET /metrics``: the session store's counters in the Prometheus text format (v0.0.4)."""

from __future__ import annotations

from edgespec.server.sessions import SessionStore

_COUNTERS = (
    ("sessions_opened", "Verification sessions opened (re-opens included)."),
    ("sessions_closed", "Verification sessions closed by their clients."),
    ("sessions_expired", "Verification sessions dropped after the idle TTL."),
    ("sessions_evicted", "Verification sessions evicted (least recently used) at a cap."),
    ("rounds", "Verification rounds answered."),
    ("drafted_tokens", "Draft tokens received for verification."),
    ("accepted_tokens", "Draft tokens accepted by the target."),
    ("completions", "OpenAI-compatible completions served."),
)


def prometheus_text(store: SessionStore) -> str:
    lines = [
        "# HELP edgespec_sessions Open verification sessions.",
        "# TYPE edgespec_sessions gauge",
        f"edgespec_sessions {store.count}",
        "# HELP edgespec_cache_bytes Bytes held by the sessions' target KV caches.",
        "# TYPE edgespec_cache_bytes gauge",
        f"edgespec_cache_bytes {store.cache_bytes()}",
        "# HELP edgespec_queue_depth Requests waiting for the model.",
        "# TYPE edgespec_queue_depth gauge",
        f"edgespec_queue_depth {store.waiting}",
        "# HELP edgespec_suggested_k The draft length the server suggests now.",
        "# TYPE edgespec_suggested_k gauge",
        f"edgespec_suggested_k {store.suggested_k()}",
    ]
    for name, help_text in _COUNTERS:
        lines += [
            f"# HELP edgespec_{name}_total {help_text}",
            f"# TYPE edgespec_{name}_total counter",
            f"edgespec_{name}_total {store.counters[name]}",
        ]
    lines += [
        "# HELP edgespec_verify_seconds Time of verification rounds (target pass and acceptance).",
        "# TYPE edgespec_verify_seconds summary",
        f"edgespec_verify_seconds_sum {store.verify_s_sum:.6f}",
        f"edgespec_verify_seconds_count {store.counters['rounds']}",
        "# HELP edgespec_errors_total Requests answered with an error, by HTTP status.",
        "# TYPE edgespec_errors_total counter",
    ]
    errors = sorted(
        (name.removeprefix("errors_"), count)
        for name, count in store.counters.items()
        if name.startswith("errors_")
    )
    lines += [f'edgespec_errors_total{{status="{status}"}} {count}' for status, count in errors]
    return "\n".join(lines) + "\n"
