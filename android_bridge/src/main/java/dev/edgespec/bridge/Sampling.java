package dev.edgespec.bridge;

import org.json.JSONObject;

/**
 * How the target forms and draws its next-token distribution (the Python {@code
 * SamplingConfig}): temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off;
 * mode "rejection" or "match" picks the sampling verification.
 */
public final class Sampling {
    public static final Sampling GREEDY = new Sampling(0.0, 0, 1.0, 0, "rejection");

    public final double temperature;
    public final int topK;
    public final double topP;
    public final long seed;
    public final String mode;

    public Sampling(double temperature, int topK, double topP, long seed, String mode) {
        if (!(temperature >= 0.0)) {
            throw new IllegalArgumentException("temperature " + temperature + " is negative");
        }
        if (topK < 0) {
            throw new IllegalArgumentException("top_k " + topK + " is negative");
        }
        if (!(topP > 0.0 && topP <= 1.0)) {
            throw new IllegalArgumentException("top_p " + topP + " is outside (0, 1]");
        }
        if (seed < 0) {
            throw new IllegalArgumentException("seed " + seed + " is outside [0, 2**63)");
        }
        if (!"rejection".equals(mode) && !"match".equals(mode)) {
            throw new IllegalArgumentException("unknown sampling mode '" + mode + "'");
        }
        this.temperature = temperature;
        this.topK = topK;
        this.topP = topP;
        this.seed = seed;
        this.mode = mode;
    }

    public boolean greedy() {
        return temperature == 0.0;
    }

    JSONObject toJson() {
        JSONObject data = new JSONObject();
        Json.put(data, "temperature", temperature);
        Json.put(data, "top_k", topK);
        Json.put(data, "top_p", topP);
        Json.put(data, "seed", seed);
        return Json.put(data, "mode", mode);
    }

    static Sampling fromJson(JSONObject data) {
        for (String name : new String[] {"temperature", "top_p"}) {
            Object value = data.opt(name);
            if (value instanceof Number) {
                double number = ((Number) value).doubleValue();
                if (Double.isNaN(number) || Double.isInfinite(number) || number > 1e4) {
                    throw new WireException(
                            "'" + name + "' must be a finite number no larger than 1e4");
                }
            }
        }
        try {
            return new Sampling(
                    Json.numberField(data, "temperature"),
                    Json.intField(data, "top_k"),
                    Json.numberField(data, "top_p"),
                    Json.longField(data, "seed"),
                    Json.stringField(data, "mode"));
        } catch (IllegalArgumentException error) {
            throw new WireException("bad sampling settings: " + error.getMessage());
        }
    }
}
