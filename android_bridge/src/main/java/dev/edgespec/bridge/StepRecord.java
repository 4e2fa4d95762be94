package dev.edgespec.bridge;

/**
 * One propose → verify → commit round (the Python {@code StepRecord}): {@code k} asked,
 * {@code drafted} proposed, {@code nAccepted} kept, {@code committed} emitted (cut at eos or
 * the token budget), time in the drafter and the verifier.
 */
public final class StepRecord {
    public final int round;
    public final int k;
    public final int drafted;
    public final int nAccepted;
    public final int[] committed;
    public final double draftS;
    public final int draftSteps;
    public final double verifyS;

    public StepRecord(
            int round,
            int k,
            int drafted,
            int nAccepted,
            int[] committed,
            double draftS,
            int draftSteps,
            double verifyS) {
        this.round = round;
        this.k = k;
        this.drafted = drafted;
        this.nAccepted = nAccepted;
        this.committed = committed.clone();
        this.draftS = draftS;
        this.draftSteps = draftSteps;
        this.verifyS = verifyS;
    }
}
