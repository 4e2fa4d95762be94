package dev.edgespec.bridge;

import java.io.IOException;
import java.net.ConnectException;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import org.json.JSONObject;

/**
 * An in-process verification server (a {@link Transport}) over a made-up greedy target:
 * next token = a fixed function of the last two. It speaks protocol v1 through {@link Wire},
 * forgets its sessions on {@link #restart()}, answers nothing while {@link #down}, and 503
 * for the next {@link #failures} requests. Each session has a secret that its rounds and delete
 * must send, as {@code edgespec serve} does (404 otherwise).
 */
final class FakeServer implements Transport {
    static final int VOCAB = 50;
    static final int EOS = 0;
    static final int MAX_LENGTH = 256;

    private final Map<String, int[]> sessions = new HashMap<>();
    private final Map<String, String> secrets = new HashMap<>();
    private final String apiKey;
    private int nextId;
    boolean down;
    int failures;
    int requests;
    int suggestedK = 8;

    FakeServer(String apiKey) {
        this.apiKey = apiKey;
    }

    static int target(int[] history, int length) {
        int a = history[length - 1];
        int b = length > 1 ? history[length - 2] : 7;
        int next = (a * 31 + b * 17 + 11) % VOCAB;
        return next == EOS ? 1 : next; // eos only where a test asks for it
    }

    /** The target's own greedy continuation of {@code prompt}. */
    static int[] greedy(int[] prompt, int n) {
        int[] history = Arrays.copyOf(prompt, prompt.length + n);
        for (int i = 0; i < n; i++) {
            history[prompt.length + i] = target(history, prompt.length + i);
        }
        return Arrays.copyOfRange(history, prompt.length, prompt.length + n);
    }

    void restart() {
        sessions.clear();
    }

    @Override
    public Reply send(String method, String url, String body, Map<String, String> headers)
            throws IOException {
        requests++;
        if (down) {
            throw new ConnectException("Connection refused");
        }
        if (failures > 0) {
            failures--;
            return new Reply(503, "{\"detail\": \"busy\"}");
        }
        String path = url.substring(url.indexOf('/', "http://".length()));
        if (apiKey != null && !path.equals("/health")
                && !("Bearer " + apiKey).equals(headers.get("Authorization"))) {
            return new Reply(401, "{\"detail\": \"missing or wrong API key\"}");
        }
        try {
            return new Reply(200, route(method, path, body, headers).toString());
        } catch (WireException error) {
            return new Reply(422, Json.put(new JSONObject(), "detail", error.getMessage()).toString());
        } catch (IllegalStateException error) {
            return new Reply(404, Json.put(new JSONObject(), "detail", error.getMessage()).toString());
        }
    }

    private JSONObject route(
            String method, String path, String body, Map<String, String> headers) {
        if (path.equals("/health")) {
            return Json.put(new JSONObject(), "status", "ok");
        }
        if (path.equals("/v1/verify/info")) {
            return new Wire.ServerInfo(
                            VOCAB, MAX_LENGTH, new int[] {EOS}, "0", 8, 0.002,
                            new double[] {1, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8})
                    .toJson();
        }
        if (path.equals("/v1/verify/sessions") && method.equals("POST")) {
            Wire.OpenRequest open = Wire.OpenRequest.fromJson(Json.parse(body), VOCAB, MAX_LENGTH);
            String id = "s" + nextId;
            String secret = "secret-" + nextId++;
            sessions.put(id, open.prompt.clone());
            secrets.put(id, secret);
            return new Wire.OpenResponse(id, open.prompt.length - 1, suggestedK, secret).toJson();
        }
        String id = path.split("/")[4];
        int[] history = sessions.get(id);
        if (history == null || !secrets.get(id).equals(headers.get(Wire.SESSION_SECRET_HEADER))) {
            throw new IllegalStateException("no session " + id + " with that secret");
        }
        if (method.equals("DELETE")) {
            sessions.remove(id);
            return Json.put(new JSONObject(), "closed", true);
        }
        Wire.VerifyRequest round = Wire.VerifyRequest.fromJson(Json.parse(body), VOCAB, MAX_LENGTH);
        if (round.position >= history.length || history[round.position] != round.lastToken) {
            throw new WireException("position " + round.position + " is out of step");
        }
        // Crop to the position, then verify [last] + draft: idempotent when resent.
        int length = round.position + 1;
        int[] grown = Arrays.copyOf(history, length + round.draft.length + 1);
        int accepted = 0;
        while (accepted < round.draft.length && target(grown, length) == round.draft[accepted]) {
            grown[length++] = round.draft[accepted++];
        }
        grown[length] = target(grown, length);
        length++;
        sessions.put(id, Arrays.copyOf(grown, length));
        int[] tokens = Arrays.copyOfRange(grown, round.position + 1, length);
        return new Wire.VerifyResponse(accepted, tokens, length - 1, suggestedK, 0.001).toJson();
    }
}
