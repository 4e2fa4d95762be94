package dev.edgespec.bridge;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.Random;
import org.json.JSONObject;

/**
 * A verification server ({@code edgespec serve}): base URL, bearer API key, and the retry
 * policy (the Python {@code ServerTarget}). Transport failures and HTTP 429/5xx are retried
 * until {@code deadlineMs} after a request's first attempt (at most {@code retries} times),
 * pausing {@code backoffMs}, doubled each time up to 2 s, each pause drawn between half and
 * all of that; then {@link RemoteUnavailableException}. A server that is back within the
 * deadline (a restart) loses no generation.
 */
public final class RemoteTarget {
    /** One answered request: status, JSON body (null when not JSON), bytes each way. */
    public static final class Exchange {
        public final int status;
        public final JSONObject data;
        public final String text;
        public final int sent;
        public final int received;
        public final int attempts;

        Exchange(int status, String text, int sent, int attempts) {
            this.status = status;
            this.text = text;
            JSONObject parsed;
            try {
                parsed = Json.parse(text);
            } catch (WireException error) {
                parsed = null;
            }
            this.data = parsed;
            this.sent = sent;
            this.received = text.getBytes(StandardCharsets.UTF_8).length;
            this.attempts = attempts;
        }

        /** Throws {@link RemoteException} for a 4xx answer or a body that is not JSON. */
        public JSONObject require(String what) {
            if (status >= 400) {
                Object detail = data != null ? data.opt("detail") : text;
                throw new RemoteException(
                        "the verification server refused " + what + ": HTTP " + status + " "
                                + detail,
                        status);
            }
            if (data == null) {
                throw new RemoteException("the answer to " + what + " is not JSON: " + text, 0);
            }
            return data;
        }
    }

    /** Sleeps between retries (a fake in tests). */
    public interface Sleeper {
        void sleep(long millis) throws InterruptedException;
    }

    /** The default deadline of one request, retries included. */
    public static final long DEADLINE_MS = 30_000;
    /** The longest pause between two attempts. */
    public static final long MAX_BACKOFF_MS = 2_000;

    private final String url;
    private final String apiKey;
    private final Transport transport;
    private final int retries;
    private final long backoffMs;
    private final Sleeper sleeper;
    private final long deadlineMs;
    private final Random jitter = new Random();
    private Wire.ServerInfo info;

    /** Retries within {@link #DEADLINE_MS}, with backoff from 200 ms. */
    public RemoteTarget(String url, String apiKey) {
        this(url, apiKey, new HttpTransport(10_000, 30_000), Integer.MAX_VALUE, 200,
                Thread::sleep, DEADLINE_MS);
    }

    public RemoteTarget(
            String url,
            String apiKey,
            Transport transport,
            int retries,
            long backoffMs,
            Sleeper sleeper) {
        this(url, apiKey, transport, retries, backoffMs, sleeper, DEADLINE_MS);
    }

    public RemoteTarget(
            String url,
            String apiKey,
            Transport transport,
            int retries,
            long backoffMs,
            Sleeper sleeper,
            long deadlineMs) {
        this.url = url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
        this.apiKey = apiKey;
        this.transport = transport;
        this.retries = retries;
        this.backoffMs = backoffMs;
        this.sleeper = sleeper;
        this.deadlineMs = deadlineMs;
    }

    /** The pause after the {@code attempts}-th failure: doubling, capped, jittered. */
    long backoff(int attempts) {
        long ceiling = Math.min(MAX_BACKOFF_MS, backoffMs << Math.min(attempts - 1, 20));
        return (long) (ceiling * (0.5 + 0.5 * jitter.nextDouble()));
    }

    public String url() {
        return url;
    }

    static boolean retryable(int status) {
        return status == 429 || status >= 500;
    }

    /** Sends one request, retrying transport failures and 429/5xx with backoff. */
    public Exchange request(String method, String path, JSONObject body, boolean retry) {
        return request(method, path, body, retry, Collections.<String, String>emptyMap());
    }

    /** {@link #request(String, String, JSONObject, boolean)} with {@code extra} headers. */
    public Exchange request(
            String method, String path, JSONObject body, boolean retry, Map<String, String> extra) {
        String content = body == null ? null : body.toString();
        Map<String, String> headers = new HashMap<>(extra);
        if (apiKey != null && !apiKey.isEmpty()) {
            headers.put("Authorization", "Bearer " + apiKey);
        }
        if (content != null) {
            headers.put("Content-Type", "application/json");
        }
        long limit = retry ? 1L + retries : 1L;
        long deadline = System.nanoTime() + deadlineMs * 1_000_000L;
        String problem = "";
        IOException lastError = null;
        int attempt = 0;
        for (; attempt < limit; attempt++) {
            if (attempt > 0) {
                long remainingMs = (deadline - System.nanoTime()) / 1_000_000L;
                if (remainingMs <= 0) {
                    break;
                }
                try {
                    sleeper.sleep(Math.min(backoff(attempt), remainingMs));
                } catch (InterruptedException error) {
                    Thread.currentThread().interrupt();
                    throw new RemoteUnavailableException("interrupted while retrying", error);
                }
            }
            Transport.Reply reply;
            try {
                reply = transport.send(method, url + path, content, headers);
            } catch (IOException error) {
                lastError = error;
                problem = error.getClass().getSimpleName() + ": " + error.getMessage();
                continue;
            }
            if (retryable(reply.status)) {
                problem = "HTTP " + reply.status;
                continue;
            }
            int sent = content == null ? 0 : content.getBytes(StandardCharsets.UTF_8).length;
            return new Exchange(reply.status, reply.body, sent, attempt + 1);
        }
        throw new RemoteUnavailableException(
                "the verification server " + url + " did not answer " + method + " " + path
                        + " after " + attempt + " attempt(s) (" + problem + ")",
                lastError);
    }

    /** The server's target description (fetched once). */
    public synchronized Wire.ServerInfo info() {
        if (info == null) {
            JSONObject data = request("GET", "/v1/verify/info", null, true).require("GET info");
            info = Wire.ServerInfo.fromJson(data);
        }
        return info;
    }

    /** The fastest of {@code repeats} {@code GET /health} exchanges, in seconds. */
    public double measureRtt(int repeats) {
        double best = Double.POSITIVE_INFINITY;
        for (int i = 0; i < repeats; i++) {
            long started = System.nanoTime();
            request("GET", "/health", null, true);
            best = Math.min(best, (System.nanoTime() - started) / 1e9);
        }
        return best;
    }
}
