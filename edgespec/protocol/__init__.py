"""Verification protocol v1: the records a remote verifier and ``edgespec serve`` exchange.

Pure (numpy and the standard library): both sides import it, and the JSON test vectors in
``tests/vectors/`` pin it down for other clients (the Android bridge). Every ``from_json``
validates what it reads and raises :class:`ProtocolError` with a message; the server answers those
with a 4xx. The "Protocol v1" section of docs/serving.md is the prose version of this package.

A round verifies ``[last_token] + draft`` where ``last_token`` sits at absolute ``position``:
the server crops its cache to ``position`` tokens first, so a retried round is idempotent.
q_draft travels ``sparse`` (ids and float64 probabilities of the nonzero entries: exact, and
small when the draft samples from a top-k or top-p truncated distribution) or as ``fp16``
rows (base64, little-endian; compact but rounded). Greedy and match rounds send no q_draft.
Rejection rounds also send ``uniforms``: the k + 1 next draws of the client's generator, which
the server's acceptance test consumes in order, so that remote sampling equals local sampling.

A session belongs to the client that opened it: the open answer carries a ``session_secret``
that every round and delete of the session sends back in the ``SESSION_SECRET_HEADER`` header
(a header, not the path, so that proxies' access logs do not record it). A server that
answers no secret (older than the field) needs none.

The modules: :mod:`~edgespec.protocol.sessions` (opening a session and its rounds),
:mod:`~edgespec.protocol.q_draft` (the draft's probabilities on the wire),
:mod:`~edgespec.protocol.server_info` (what a server tells a client before it opens sessions)
and :mod:`~edgespec.protocol.validation` (the checked reading of fields they share). This
module holds the version and the limits every side agrees on.
"""

PROTOCOL_VERSION = 1
#: The longest draft a round may carry.
MAX_K = 32
#: The header rounds and deletes carry a session's secret in (from ``OpenResponse``).
SESSION_SECRET_HEADER = "Edgespec-Session-Secret"
