package dev.edgespec.bridge;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import org.json.JSONObject;

/**
 * A command-line client for trying a server from a JVM, and the tests' driver:
 *
 * <pre>
 * java -cp edgespec-bridge.jar:json.jar dev.edgespec.bridge.Cli --url http://127.0.0.1:8000 \
 *     --prompt-ids 1,2,3 [--max-new-tokens 64] [--k 4|auto] [--drafter lookup|none]
 *     [--temperature T --top-k N --top-p P --seed S --mode rejection|match]
 *     [--api-key KEY] [--deadline-ms 30000] [--retries N] [--backoff-ms 200]
 *     [--pause-after-round N]
 * </pre>
 *
 * It prints one JSON line: the new tokens, the finish reason and the session counters, or
 * {@code {"error": ..., "partial_tokens": [...]}} with exit status 3 when the server stayed
 * away. {@code --pause-after-round N} prints {@code {"paused": N}} after round N and waits for
 * a line on stdin (the tests stop and restart the server meanwhile).
 */
public final class Cli {
    private Cli() {}

    public static void main(String[] args) throws IOException {
        Map<String, String> options = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected an --option, got " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        System.exit(run(options));
    }

    private static int[] ids(String text) {
        String[] parts = text.split(",");
        int[] ids = new int[parts.length];
        for (int i = 0; i < parts.length; i++) {
            ids[i] = Integer.parseInt(parts[i].trim());
        }
        return ids;
    }

    static int run(Map<String, String> options) throws IOException {
        RemoteTarget target =
                new RemoteTarget(
                        options.get("url"),
                        options.get("api-key"),
                        new HttpTransport(5_000, 60_000),
                        options.containsKey("retries")
                                ? Integer.parseInt(options.get("retries"))
                                : Integer.MAX_VALUE,
                        Long.parseLong(options.getOrDefault("backoff-ms", "200")),
                        Thread::sleep,
                        Long.parseLong(
                                options.getOrDefault(
                                        "deadline-ms", String.valueOf(RemoteTarget.DEADLINE_MS))));
        Sampling sampling =
                new Sampling(
                        Double.parseDouble(options.getOrDefault("temperature", "0")),
                        Integer.parseInt(options.getOrDefault("top-k", "0")),
                        Double.parseDouble(options.getOrDefault("top-p", "1")),
                        Long.parseLong(options.getOrDefault("seed", "0")),
                        options.getOrDefault("mode", "rejection"));
        String k = options.getOrDefault("k", "4");
        KPolicy kPolicy =
                "auto".equals(k)
                        ? new AutoK(CostProfile.remote(target.info(), target.measureRtt(3), 0.0), 8)
                        : KPolicy.fixed(Integer.parseInt(k));
        Drafter drafter =
                "none".equals(options.getOrDefault("drafter", "lookup"))
                        ? new NoDrafter()
                        : new PromptLookupDrafter();
        int pauseAfter = Integer.parseInt(options.getOrDefault("pause-after-round", "-1"));
        BufferedReader stdin =
                new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        SpeculativeDecoder.RoundListener listener =
                record -> {
                    if (record.round == pauseAfter) {
                        System.out.println(Json.put(new JSONObject(), "paused", pauseAfter));
                        System.out.flush();
                        try {
                            stdin.readLine();
                        } catch (IOException error) {
                            throw new IllegalStateException(error);
                        }
                    }
                };
        JSONObject out = new JSONObject();
        int maxNewTokens = Integer.parseInt(options.getOrDefault("max-new-tokens", "64"));
        try {
            SpeculativeDecoder.Generation generation =
                    new SpeculativeDecoder(target, null, "auto".equals(k))
                            .generate(ids(options.get("prompt-ids")), drafter, kPolicy, sampling,
                                    maxNewTokens, listener);
            Json.put(out, "tokens", Json.array(generation.tokens));
            Json.put(out, "finish_reason", generation.finishReason);
            Json.put(out, "rounds", generation.rounds.size());
            Json.put(out, "reopens", generation.reopens);
            Json.put(out, "retries", generation.retries);
            Json.put(out, "round_trips", generation.roundTrips);
            Json.put(out, "acceptance", generation.acceptance());
            System.out.println(out);
            return 0;
        } catch (RemoteUnavailableException error) {
            Json.put(out, "error", error.getMessage());
            Json.put(out, "partial_tokens", Json.array(error.partialTokens()));
            System.out.println(out);
            return 3;
        }
    }

    /** Drafts nothing: every round is one plain target step. */
    static final class NoDrafter implements Drafter {
        @Override
        public void begin(int[] prompt, Sampling sampling) {}

        @Override
        public Draft propose(int k) {
            return Draft.EMPTY;
        }

        @Override
        public void commit(int nAccepted, int nextToken) {}
    }
}
