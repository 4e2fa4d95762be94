package dev.edgespec.bridge;

/** The target's answer to one round: the accepted draft tokens then its own next token. */
public final class Verdict {
    public final int[] tokens;
    public final int nAccepted;
    public final double elapsedS;

    public Verdict(int[] tokens, int nAccepted, double elapsedS) {
        this.tokens = tokens.clone();
        this.nAccepted = nAccepted;
        this.elapsedS = elapsedS;
    }
}
