package dev.edgespec.bridge;

import org.json.JSONArray;
import org.json.JSONObject;

/**
 * Protocol v1 of {@code edgespec serve} (the Python {@code edgespec.runtime.verifiers.wire}):
 * the five messages, their JSON, and the same validation and messages. The shared vectors in
 * {@code tests/vectors/protocol_v1.json} pin both sides down.
 *
 * <p>A round verifies {@code [lastToken] + draft} where {@code lastToken} sits at absolute
 * {@code position}: the server crops its cache to {@code position} tokens first, so a retried
 * round is idempotent.
 *
 * <p>A session belongs to the client that opened it: the open answer's {@code session_secret}
 * goes back in the {@link #SESSION_SECRET_HEADER} header of every round and delete.
 */
public final class Wire {
    public static final int PROTOCOL_VERSION = 1;
    /** The header rounds and deletes carry a session's secret in. */
    public static final String SESSION_SECRET_HEADER = "Edgespec-Session-Secret";
    /** The longest draft a round may carry. */
    public static final int MAX_K = 32;
    /** Rows with at most this many nonzero probabilities travel sparse by default. */
    public static final int MAX_SPARSE = 1024;

    private Wire() {}

    static void checkVersion(JSONObject data) {
        Object version = data.has("protocol") ? data.opt("protocol") : PROTOCOL_VERSION;
        if (!(Json.isInteger(version) && ((Number) version).longValue() == PROTOCOL_VERSION)) {
            throw new WireException(
                    "protocol version " + version + " is not supported (this is v1)");
        }
    }

    static JSONObject header() {
        return Json.put(new JSONObject(), "protocol", PROTOCOL_VERSION);
    }

    /** Draws the rejection test consumes: one per tested token, one for the next token. */
    public static int uniformsUsed(int nAccepted, int k) {
        return nAccepted == k ? k + 1 : nAccepted + 2;
    }

    /** Start (or re-open) a session: the server prefills {@code prompt[:-1]}. */
    public static final class OpenRequest {
        public final int[] prompt;
        public final Sampling sampling;

        public OpenRequest(int[] prompt, Sampling sampling) {
            this.prompt = prompt.clone();
            this.sampling = sampling;
        }

        public JSONObject toJson() {
            JSONObject data = header();
            Json.put(data, "prompt", Json.array(prompt));
            return Json.put(data, "sampling", sampling.toJson());
        }

        public static OpenRequest fromJson(JSONObject data, int vocabSize, int maxLength) {
            checkVersion(data);
            int[] prompt = Json.tokenIds("prompt", Json.listField(data, "prompt"), vocabSize);
            if (prompt.length == 0) {
                throw new WireException("'prompt' is empty: send at least one token");
            }
            if (prompt.length >= maxLength) {
                throw new WireException(
                        "the prompt (" + prompt.length + " tokens) fills the context of "
                                + maxLength);
            }
            return new OpenRequest(prompt, Sampling.fromJson(Json.objectField(data, "sampling")));
        }
    }

    /** {@code sessionSecret}: null from a server older than the field (it needs none). */
    public static final class OpenResponse {
        public final String sessionId;
        public final int length;
        public final int suggestedK;
        public final String sessionSecret;

        public OpenResponse(String sessionId, int length, int suggestedK, String sessionSecret) {
            this.sessionId = sessionId;
            this.length = length;
            this.suggestedK = suggestedK;
            this.sessionSecret = sessionSecret;
        }

        public JSONObject toJson() {
            JSONObject data = header();
            Json.put(data, "session_id", sessionId);
            Json.put(data, "length", length);
            Json.put(data, "suggested_k", suggestedK);
            return sessionSecret == null ? data : Json.put(data, "session_secret", sessionSecret);
        }

        public static OpenResponse fromJson(JSONObject data) {
            checkVersion(data);
            return new OpenResponse(
                    Json.stringField(data, "session_id"),
                    Json.intField(data, "length"),
                    Json.intField(data, "suggested_k"),
                    data.has("session_secret") && !data.isNull("session_secret")
                            ? Json.stringField(data, "session_secret")
                            : null);
        }
    }

    /** One round; {@code qDraft} [k][vocab] for rejection rounds, else null. */
    public static final class VerifyRequest {
        public final int position;
        public final int lastToken;
        public final int[] draft;
        public final double[][] qDraft;
        public final double[] uniforms;

        public VerifyRequest(
                int position, int lastToken, int[] draft, double[][] qDraft, double[] uniforms) {
            this.position = position;
            this.lastToken = lastToken;
            this.draft = draft.clone();
            this.qDraft = qDraft;
            this.uniforms = uniforms.clone();
        }

        public JSONObject toJson(String qFormat) {
            JSONObject data = header();
            Json.put(data, "position", position);
            Json.put(data, "last_token", lastToken);
            Json.put(data, "draft", Json.array(draft));
            if (qDraft != null) {
                Json.put(data, "q_draft", QDraft.encode(qDraft, qFormat(qFormat)));
            }
            if (uniforms.length > 0) {
                Json.put(data, "uniforms", Json.array(uniforms));
            }
            return data;
        }

        private String qFormat(String asked) {
            if (asked != null) {
                return asked;
            }
            int widest = 0;
            for (double[] row : qDraft) {
                int nonzero = 0;
                for (double p : row) {
                    nonzero += p != 0.0 ? 1 : 0;
                }
                widest = Math.max(widest, nonzero);
            }
            return widest <= MAX_SPARSE ? "sparse" : "fp16";
        }

        public static VerifyRequest fromJson(JSONObject data, int vocabSize, int maxLength) {
            checkVersion(data);
            int position = Json.intField(data, "position");
            int lastToken = Json.intField(data, "last_token");
            Json.tokenIds("last_token", new JSONArray().put(lastToken), vocabSize);
            int[] draft = Json.tokenIds("draft", Json.listField(data, "draft"), vocabSize);
            if (draft.length > MAX_K) {
                throw new WireException(
                        "k = " + draft.length + " draft tokens is more than the limit of "
                                + MAX_K);
            }
            if (position < 0 || position + 1 + draft.length > maxLength) {
                throw new WireException(
                        "position " + position + " with " + draft.length
                                + " draft tokens is outside the context of " + maxLength);
            }
            double[][] qDraft = null;
            if (data.has("q_draft") && !data.isNull("q_draft")) {
                qDraft = QDraft.decode(data.opt("q_draft"), draft.length, vocabSize);
            }
            Object raw = data.has("uniforms") ? data.opt("uniforms") : new JSONArray();
            if (!(raw instanceof JSONArray) || ((JSONArray) raw).length() > draft.length + 1) {
                throw new WireException(
                        "'uniforms' must be a list of at most k + 1 = " + (draft.length + 1));
            }
            JSONArray listed = (JSONArray) raw;
            double[] uniforms = new double[listed.length()];
            for (int i = 0; i < uniforms.length; i++) {
                Object u = listed.opt(i);
                double value = u instanceof Number ? ((Number) u).doubleValue() : -1.0;
                if (!(value >= 0.0 && value < 1.0)) {
                    throw new WireException("'uniforms' must hold numbers in [0, 1)");
                }
                uniforms[i] = value;
            }
            return new VerifyRequest(position, lastToken, draft, qDraft, uniforms);
        }
    }

    /** {@code tokens} = the accepted draft tokens then the target's own (nAccepted + 1). */
    public static final class VerifyResponse {
        public final int nAccepted;
        public final int[] tokens;
        public final int length;
        public final int suggestedK;
        public final double verifyS;

        public VerifyResponse(
                int nAccepted, int[] tokens, int length, int suggestedK, double verifyS) {
            this.nAccepted = nAccepted;
            this.tokens = tokens.clone();
            this.length = length;
            this.suggestedK = suggestedK;
            this.verifyS = verifyS;
        }

        public JSONObject toJson() {
            JSONObject data = header();
            Json.put(data, "n_accepted", nAccepted);
            Json.put(data, "tokens", Json.array(tokens));
            Json.put(data, "length", length);
            Json.put(data, "suggested_k", suggestedK);
            return Json.put(data, "verify_s", verifyS);
        }

        public static VerifyResponse fromJson(JSONObject data, int k) {
            checkVersion(data);
            int nAccepted = Json.intField(data, "n_accepted");
            int[] tokens = Json.tokenIds("tokens", Json.listField(data, "tokens"), 0);
            if (nAccepted < 0 || nAccepted > k || tokens.length != nAccepted + 1) {
                throw new WireException(
                        nAccepted + " accepted and tokens " + java.util.Arrays.toString(tokens)
                                + " do not fit a k = " + k + " draft");
            }
            return new VerifyResponse(
                    nAccepted,
                    tokens,
                    Json.intField(data, "length"),
                    Json.intField(data, "suggested_k"),
                    Json.numberField(data, "verify_s"));
        }
    }

    /** {@code GET /v1/verify/info}: what a client checks before it opens sessions. */
    public static final class ServerInfo {
        public final int vocabSize;
        public final int maxLength;
        public final int[] eosTokenIds;
        public final String tokenizerSha256;
        public final int maxK;
        public final double targetStepS;
        /** T(w)/T(1) for w = 1..; {@code verifyCost[w - 1]}. */
        public final double[] verifyCost;

        public ServerInfo(
                int vocabSize,
                int maxLength,
                int[] eosTokenIds,
                String tokenizerSha256,
                int maxK,
                double targetStepS,
                double[] verifyCost) {
            this.vocabSize = vocabSize;
            this.maxLength = maxLength;
            this.eosTokenIds = eosTokenIds.clone();
            this.tokenizerSha256 = tokenizerSha256;
            this.maxK = maxK;
            this.targetStepS = targetStepS;
            this.verifyCost = verifyCost.clone();
        }

        public JSONObject toJson() {
            JSONObject data = header();
            Json.put(data, "vocab_size", vocabSize);
            Json.put(data, "max_length", maxLength);
            Json.put(data, "eos_token_ids", Json.array(eosTokenIds));
            Json.put(data, "tokenizer_sha256", tokenizerSha256);
            Json.put(data, "max_k", maxK);
            Json.put(data, "target_step_s", targetStepS);
            return Json.put(data, "verify_cost", Json.array(verifyCost));
        }

        public static ServerInfo fromJson(JSONObject data) {
            checkVersion(data);
            return new ServerInfo(
                    Json.intField(data, "vocab_size"),
                    Json.intField(data, "max_length"),
                    Json.tokenIds("eos_token_ids", Json.listField(data, "eos_token_ids"), 0),
                    Json.stringField(data, "tokenizer_sha256"),
                    Json.intField(data, "max_k"),
                    Json.numberField(data, "target_step_s"),
                    Json.numbers("verify_cost", Json.listField(data, "verify_cost")));
        }
    }
}
