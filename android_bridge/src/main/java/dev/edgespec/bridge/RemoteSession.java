package dev.edgespec.bridge;

import java.util.Arrays;
import java.util.Collections;
import java.util.Map;
import org.json.JSONObject;

/**
 * One generation's session on a {@link RemoteTarget} (the Python {@code RemoteVerifier}).
 *
 * <p>The client owns the token history. When the server lost the session (restart, idle TTL,
 * eviction: HTTP 404/409) it is re-opened from the client's own tokens and the round is sent
 * again; a round names the absolute position of its last token, so the resent round is
 * idempotent. Nothing is lost or duplicated. Rounds and the delete carry the session's secret
 * (from the open answer), without which the server answers as for an unknown session.
 */
public final class RemoteSession implements AutoCloseable {
    private final RemoteTarget target;
    private final String qFormat;
    private int[] history = new int[0];
    private int length;
    private String sessionId;
    /** The session's secret header (empty from a server that sends none). */
    private Map<String, String> secret = Collections.emptyMap();
    private Sampling sampling = Sampling.GREEDY;
    private Uniforms uniforms;
    private int suggestedK;
    private int roundTrips;
    private long bytesSent;
    private long bytesReceived;
    private int reopens;
    private int retries;
    private double roundsS;
    private double networkS;

    /** {@code qFormat} "sparse", "fp16" or null (sparse when rows are narrow enough). */
    public RemoteSession(RemoteTarget target, String qFormat) {
        this.target = target;
        this.qFormat = qFormat;
        this.suggestedK = target.info().maxK;
    }

    public RemoteSession(RemoteTarget target) {
        this(target, null);
    }

    public void begin(int[] prompt, Sampling sampling) {
        if (prompt.length == 0) {
            throw new IllegalArgumentException("the prompt is empty: send at least one token");
        }
        this.sampling = sampling;
        this.uniforms = new Uniforms(sampling.seed);
        this.history = prompt.clone();
        this.length = prompt.length;
        open();
    }

    private RemoteTarget.Exchange exchange(String method, String path, JSONObject body) {
        RemoteTarget.Exchange exchange = target.request(method, path, body, true, secret);
        roundTrips++;
        bytesSent += exchange.sent;
        bytesReceived += exchange.received;
        retries += exchange.attempts - 1;
        return exchange;
    }

    private void open() {
        secret = Collections.emptyMap();
        Wire.OpenRequest request =
                new Wire.OpenRequest(Arrays.copyOf(history, length), sampling);
        JSONObject data =
                exchange("POST", "/v1/verify/sessions", request.toJson()).require("opening a session");
        Wire.OpenResponse opened = Wire.OpenResponse.fromJson(data);
        sessionId = opened.sessionId;
        suggestedK = opened.suggestedK;
        if (opened.sessionSecret != null) {
            secret = Collections.singletonMap(Wire.SESSION_SECRET_HEADER, opened.sessionSecret);
        }
    }

    private boolean rejection() {
        return !sampling.greedy() && "rejection".equals(sampling.mode);
    }

    public Verdict verify(int lastToken, Draft draft) {
        if (sessionId == null) {
            throw new IllegalStateException("call begin(prompt, sampling) first");
        }
        if (lastToken != history[length - 1]) {
            throw new IllegalArgumentException(
                    "last token " + lastToken + " is not the history's " + history[length - 1]);
        }
        long started = System.nanoTime();
        int k = draft.tokens.length;
        double[][] qDraft = null;
        double[] sent = new double[0];
        if (rejection()) {
            sent = uniforms.peek(k + 1);
            qDraft = k == 0 ? null : draft.qDraft != null ? draft.qDraft : oneHot(draft.tokens);
        }
        Wire.VerifyRequest request =
                new Wire.VerifyRequest(length - 1, lastToken, draft.tokens, qDraft, sent);
        JSONObject body = request.toJson(qFormat);
        RemoteTarget.Exchange exchange = exchange("POST", roundsPath(), body);
        if (exchange.status == 404 || exchange.status == 409) {
            reopens++;
            open();
            exchange = exchange("POST", roundsPath(), body);
        }
        JSONObject data = exchange.require("a verification round");
        Wire.VerifyResponse answer;
        try {
            answer = Wire.VerifyResponse.fromJson(data, k);
        } catch (WireException error) {
            throw new RemoteException("the server's answer is malformed: " + error.getMessage(), 0);
        }
        if (rejection()) {
            uniforms.take(Wire.uniformsUsed(answer.nAccepted, k));
        }
        append(answer.tokens);
        suggestedK = answer.suggestedK;
        double elapsed = (System.nanoTime() - started) / 1e9;
        roundsS += elapsed;
        networkS += Math.max(elapsed - answer.verifyS, 0.0);
        return new Verdict(answer.tokens, answer.nAccepted, elapsed);
    }

    private String roundsPath() {
        return "/v1/verify/sessions/" + sessionId + "/rounds";
    }

    private double[][] oneHot(int[] tokens) {
        double[][] rows = new double[tokens.length][target.info().vocabSize];
        for (int i = 0; i < tokens.length; i++) {
            rows[i][tokens[i]] = 1.0;
        }
        return rows;
    }

    private void append(int[] tokens) {
        if (length + tokens.length > history.length) {
            history = Arrays.copyOf(history, Math.max(2 * history.length, length + tokens.length));
        }
        System.arraycopy(tokens, 0, history, length, tokens.length);
        length += tokens.length;
    }

    /** Prompt and every verified token, in order. */
    public int[] history() {
        return Arrays.copyOf(history, length);
    }

    /** The server's latest suggestion for k (its max_k divided by its queue). */
    public int suggestedK() {
        return suggestedK;
    }

    public int roundTrips() {
        return roundTrips;
    }

    public long bytesSent() {
        return bytesSent;
    }

    public long bytesReceived() {
        return bytesReceived;
    }

    public int reopens() {
        return reopens;
    }

    public int retries() {
        return retries;
    }

    /** Network share of the round time (round time minus the server's verify time). */
    public double rttShare() {
        return roundsS > 0 ? networkS / roundsS : 0.0;
    }

    /** Closes the server's session (best effort: it expires by itself otherwise). */
    @Override
    public void close() {
        if (sessionId == null) {
            return;
        }
        try {
            target.request("DELETE", "/v1/verify/sessions/" + sessionId, null, false, secret);
        } catch (RemoteUnavailableException ignored) {
            // The server is gone: its sessions went with it.
        }
        sessionId = null;
    }
}
