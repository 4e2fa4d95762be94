package dev.edgespec.bridge;

/**
 * Budgets the generation stays inside (null: no budget of that kind), as the Python {@code
 * BudgetConfig}: watched RSS ({@code memoryMb}), power ({@code powerW}), energy per token,
 * and {@code minBatteryPct} on battery. A mode change waits {@code holdS}; a condition counts
 * as recovered only {@code hysteresis} (a fraction) below its budget; {@code checkEveryS}
 * spaces the reads between rounds.
 */
public final class BudgetConfig {
    public final Double memoryMb;
    public final Double powerW;
    public final Double energyPerTokenJ;
    public final Double minBatteryPct;
    public final double holdS;
    public final double hysteresis;
    public final double checkEveryS;

    public BudgetConfig(
            Double memoryMb,
            Double powerW,
            Double energyPerTokenJ,
            Double minBatteryPct,
            double holdS,
            double hysteresis,
            double checkEveryS) {
        for (Double value : new Double[] {memoryMb, powerW, energyPerTokenJ}) {
            if (value != null && !(value > 0)) {
                throw new IllegalArgumentException("a budget is " + value + ": use a positive value");
            }
        }
        if (minBatteryPct != null && !(minBatteryPct >= 0 && minBatteryPct <= 100)) {
            throw new IllegalArgumentException("min_battery_pct " + minBatteryPct + " is outside [0, 100]");
        }
        if (!(hysteresis >= 0.0 && hysteresis < 1.0)) {
            throw new IllegalArgumentException("hysteresis " + hysteresis + " is outside [0, 1)");
        }
        if (holdS < 0 || checkEveryS < 0) {
            throw new IllegalArgumentException("hold_s and check_every_s must be >= 0");
        }
        this.memoryMb = memoryMb;
        this.powerW = powerW;
        this.energyPerTokenJ = energyPerTokenJ;
        this.minBatteryPct = minBatteryPct;
        this.holdS = holdS;
        this.hysteresis = hysteresis;
        this.checkEveryS = checkEveryS;
    }

    /** Only a battery floor, with the Python defaults for the rest. */
    public static BudgetConfig battery(double minBatteryPct) {
        return new BudgetConfig(null, null, null, minBatteryPct, 2.0, 0.15, 0.1);
    }
}
