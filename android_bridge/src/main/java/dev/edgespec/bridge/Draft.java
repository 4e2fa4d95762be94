package dev.edgespec.bridge;

/**
 * A drafter's proposal: {@code tokens}, and {@code qDraft} [k][vocab] (the draft's
 * distribution at each drafted position) when it sampled; null for a deterministic drafter,
 * whose q is one-hot. {@code elapsedS} and {@code steps} (draft model calls) feed the k policy.
 */
public final class Draft {
    public static final Draft EMPTY = new Draft(new int[0], null, 0.0, 0);

    public final int[] tokens;
    public final double[][] qDraft;
    public final double elapsedS;
    public final int steps;

    public Draft(int[] tokens, double[][] qDraft, double elapsedS, int steps) {
        this.tokens = tokens.clone();
        this.qDraft = qDraft;
        this.elapsedS = elapsedS;
        this.steps = steps;
    }

    public static Draft of(int... tokens) {
        return new Draft(tokens, null, 0.0, 0);
    }
}
