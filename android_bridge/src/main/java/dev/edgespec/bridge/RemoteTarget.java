package dev.edgespec.bridge;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import org.json.JSONObject;

/**
 * A verification server ({@code edgespec serve}): base URL, bearer API key, and the retry
 * policy (the Python {@code RemoteTarget}). Transport failures and HTTP 429/5xx are retried
 * {@code retries} times with exponential backoff ({@code backoffMs}, doubled each time);
 * then {@link RemoteUnavailableException}.
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

    private final String url;
    private final String apiKey;
    private final Transport transport;
    private final int retries;
    private final long backoffMs;
    private final Sleeper sleeper;
    private Wire.ServerInfo info;

    public RemoteTarget(String url, String apiKey) {
        this(url, apiKey, new HttpTransport(10_000, 30_000), 5, 200, Thread::sleep);
    }

    public RemoteTarget(
            String url,
            String apiKey,
            Transport transport,
            int retries,
            long backoffMs,
            Sleeper sleeper) {
        this.url = url.endsWith("/") ? url.substring(0, url.length() - 1) : url;
        this.apiKey = apiKey;
        this.transport = transport;
        this.retries = retries;
        this.backoffMs = backoffMs;
        this.sleeper = sleeper;
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
        int attempts = 1 + (retry ? retries : 0);
        String problem = "";
        IOException lastError = null;
        for (int attempt = 0; attempt < attempts; attempt++) {
            if (attempt > 0) {
                try {
                    sleeper.sleep(backoffMs << (attempt - 1));
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
                        + " after " + attempts + " attempt(s) (" + problem + ")",
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
