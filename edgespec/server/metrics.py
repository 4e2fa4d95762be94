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
        "# HELP edgespec_reserved_bytes Bytes of the cache budget kept for one scoring pass.",
        "# TYPE edgespec_reserved_bytes gauge",
        f"edgespec_reserved_bytes {store.reserved_bytes}",
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
    ]
    for name, help_text in (
        ("responses", "Requests answered, by HTTP status (every status, 500 included)."),
        ("errors", "Requests answered with an error (400 and above), by HTTP status."),
    ):
        lines += [
            f"# HELP edgespec_{name}_total {help_text}",
            f"# TYPE edgespec_{name}_total counter",
        ]
        lines += [
            f'edgespec_{name}_total{{status="{status}"}} {count}'
            for status, count in _by_status(store, f"{name}_")
        ]
    return "\n".join(lines) + "\n"


def _by_status(store: SessionStore, prefix: str) -> list[tuple[str, int]]:
    counters = dict(store.counters)  # a copy: the event loop may add a status meanwhile
    return sorted(
        (name.removeprefix(prefix), count)
        for name, count in counters.items()
        if name.startswith(prefix)
    )
