package dev.edgespec.bridge;

/**
 * {@code k = auto} (a port of the Python {@code AutoK}): picks the k in 0..kMax with the most
 * expected tokens per second, from a running per-token acceptance α and running times of
 * rounds of each k, seeded from a {@link CostProfile} ({@link CostProfile#remote} makes it
 * RTT-aware). When k = 0 wins {@code probeEvery} rounds in a row, one round drafts a single
 * token so that a recovering α is noticed.
 */
public final class AutoK implements KPolicy {
    private final int kMax;
    private final double smoothing;
    private final int probeEvery;
    private final double[] roundS;
    private double alpha;
    private double accepted;
    private double tested = 1.0;
    private int zeroRounds;

    public AutoK(CostProfile profile, int kMax, double alpha, double smoothing, int probeEvery) {
        this.kMax = Math.min(kMax, profile.verifyCost.length - 1);
        this.alpha = alpha;
        this.smoothing = smoothing;
        this.probeEvery = probeEvery;
        this.roundS = new double[this.kMax + 1];
        for (int k = 0; k <= this.kMax; k++) {
            roundS[k] = k * profile.draftStepS + profile.verifyCost[k] * profile.targetStepS;
        }
        this.accepted = alpha;
    }

    /** The Python defaults: alpha 0.6, smoothing 0.2, a probe every 16 rounds. */
    public AutoK(CostProfile profile, int kMax) {
        this(profile, kMax, 0.6, 0.2, 16);
    }

    public double alpha() {
        return alpha;
    }

    public double roundS(int k) {
        return roundS[k];
    }

    private double blend(double old, double now) {
        return (1.0 - smoothing) * old + smoothing * now;
    }

    @Override
    public int nextK() {
        int best = 0;
        double bestRate = Double.NEGATIVE_INFINITY;
        for (int k = 0; k <= kMax; k++) {
            double rate = CostProfile.expectedTokens(alpha, k) / roundS[k];
            if (rate > bestRate) { // the first of equals wins, as Python's max()
                best = k;
                bestRate = rate;
            }
        }
        if (best == 0) {
            zeroRounds++;
            if (zeroRounds >= probeEvery) {
                zeroRounds = 0;
                return 1;
            }
        } else {
            zeroRounds = 0;
        }
        return best;
    }

    @Override
    public void observe(StepRecord record) {
        if (record.drafted > 0) {
            int testedNow = record.nAccepted + (record.nAccepted < record.drafted ? 1 : 0);
            accepted = blend(accepted, record.nAccepted);
            tested = blend(tested, testedNow);
            alpha = accepted / tested;
        }
        if (record.drafted <= kMax) {
            roundS[record.drafted] = blend(roundS[record.drafted], record.draftS + record.verifyS);
        }
    }
}
