package dev.edgespec.bridge;

/**
 * Measured costs (the Python {@code CostProfile}): {@code targetStepS} = T(1);
 * {@code verifyCost[w - 1]} = T(w)/T(1); {@code draftStepS} = one draft model call.
 */
public final class CostProfile {
    public final double targetStepS;
    public final double draftStepS;
    public final double[] verifyCost;

    public CostProfile(double targetStepS, double draftStepS, double[] verifyCost) {
        this.targetStepS = targetStepS;
        this.draftStepS = draftStepS;
        this.verifyCost = verifyCost.clone();
    }

    public double c() {
        return draftStepS / targetStepS;
    }

    /**
     * The cost model of remote rounds (the Python {@code hybrid.remote_profile}): every verify
     * pass pays the round trip on top of the server's T(w), so longer round trips make longer
     * drafts pay.
     */
    public static CostProfile remote(Wire.ServerInfo info, double rttS, double draftStepS) {
        double step = rttS + info.targetStepS;
        double[] costs = new double[info.verifyCost.length];
        for (int i = 0; i < costs.length; i++) {
            costs[i] = (rttS + info.targetStepS * info.verifyCost[i]) / step;
        }
        return new CostProfile(step, draftStepS, costs);
    }

    /** E[tokens per round] = (1 − α^(k+1)) / (1 − α); k + 1 when α = 1. */
    public static double expectedTokens(double alpha, int k) {
        if (alpha >= 1.0) {
            return k + 1;
        }
        return (1.0 - Math.pow(alpha, k + 1)) / (1.0 - alpha);
    }
}
