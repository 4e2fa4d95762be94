package dev.edgespec.bridge;

import java.util.function.DoubleSupplier;

/**
 * A k policy that asks {@code inner} for k and the {@link BudgetPolicy} for the cap (the
 * Python {@code BudgetedK}); it reads the conditions at most every {@code checkEveryS} of
 * {@code clock} (seconds).
 */
public final class BudgetedK implements KPolicy {
    private final KPolicy inner;
    private final BudgetPolicy policy;
    private final Conditions.Source conditions;
    private final DoubleSupplier clock;
    private int tokens;
    private int round;
    private int cappedRounds;
    private Double checkedAt;

    public BudgetedK(
            KPolicy inner, BudgetPolicy policy, Conditions.Source conditions, DoubleSupplier clock) {
        this.inner = inner;
        this.policy = policy;
        this.conditions = conditions;
        this.clock = clock;
    }

    @Override
    public int nextK() {
        double now = clock.getAsDouble();
        if (checkedAt == null || now - checkedAt >= policy.config.checkEveryS) {
            checkedAt = now;
            policy.update(conditions.read(tokens), round);
        }
        int wanted = inner.nextK();
        int k = policy.cap(wanted);
        cappedRounds += k < wanted ? 1 : 0;
        return k;
    }

    @Override
    public void observe(StepRecord record) {
        inner.observe(record);
        tokens += record.committed.length;
        round++;
    }

    public int cappedRounds() {
        return cappedRounds;
    }

    public BudgetPolicy policy() {
        return policy;
    }
}
