package dev.edgespec.bridge;

/** Chooses the draft length of each round and learns from what happened. */
public interface KPolicy {
    int nextK();

    void observe(StepRecord record);

    /** The same k every round (k = 0 is plain target decoding). */
    static KPolicy fixed(int k) {
        if (k < 0) {
            throw new IllegalArgumentException("k must be >= 0, not " + k);
        }
        return new KPolicy() {
            @Override
            public int nextK() {
                return k;
            }

            @Override
            public void observe(StepRecord record) {}
        };
    }
}
