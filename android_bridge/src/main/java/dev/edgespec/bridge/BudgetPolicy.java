package dev.edgespec.bridge;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;

/**
 * The budget policy (a port of the Python {@code edgespec.telemetry.budget.BudgetPolicy}):
 * between rounds it picks the mode {@code full} &lt; {@code shrink} &lt; {@code off} (or
 * {@code remote}) from floors (on battery: at least shrink; battery under its minimum, RSS
 * near the memory budget or little memory available: off) and a stepping controller for power
 * and energy per token with hold time and hysteresis.
 *
 * <p>On a phone with a remote target, "off" means no drafting: k = 0 rounds are plain remote
 * target steps, so the phone does no model work. {@code remoteAvailable} is for apps that
 * verify locally and can move verification to a server instead.
 */
public final class BudgetPolicy {
    static final String[] MODES = {"full", "shrink", "off"};
    static final double LOW_AVAILABLE_MB = 100.0;
    static final double BATTERY_MARGIN_PCT = 5.0;
    static final double MEMORY_HIGH_FRACTION = 0.95;

    public final BudgetConfig config;
    private final boolean remoteAvailable;
    private final List<Decision> decisions = new ArrayList<>();
    private int level;
    private int controller;
    private String controllerReason = "";
    private Double steppedAt;
    private Double underSince;
    private boolean batteryLow;
    private boolean memoryHigh;

    public BudgetPolicy(BudgetConfig config, boolean remoteAvailable) {
        this.config = config;
        this.remoteAvailable = remoteAvailable;
    }

    public String mode() {
        if (level == 2 && remoteAvailable && !memoryHigh) {
            return "remote";
        }
        return MODES[level];
    }

    public List<Decision> decisions() {
        return Collections.unmodifiableList(decisions);
    }

    /** The k to use instead of {@code k} in the current mode (remote keeps k). */
    public int cap(int k) {
        String mode = mode();
        if ("shrink".equals(mode)) {
            return Math.min(k, Math.max(1, k / 2));
        }
        return "off".equals(mode) ? 0 : k;
    }

    private static String f0(double value) {
        return String.format(Locale.ROOT, "%.0f", value);
    }

    private int floor(Conditions seen, StringBuilder reason) {
        int floor = 0;
        boolean onBattery = Boolean.FALSE.equals(seen.plugged);
        if (config.minBatteryPct != null && seen.batteryPct != null && onBattery) {
            double limit = config.minBatteryPct + (batteryLow ? BATTERY_MARGIN_PCT : 0.0);
            batteryLow = seen.batteryPct < limit;
        } else {
            batteryLow = false;
        }
        if (onBattery) {
            floor = 1;
            reason.setLength(0);
            reason.append("on battery");
        }
        if (batteryLow) {
            floor = 2;
            reason.setLength(0);
            reason.append("battery at ").append(f0(seen.batteryPct)).append("% < ")
                    .append(f0(config.minBatteryPct)).append('%');
        }
        if (config.memoryMb != null && seen.rssMb != null) {
            double fraction = memoryHigh ? 1.0 - config.hysteresis : MEMORY_HIGH_FRACTION;
            memoryHigh = seen.rssMb >= config.memoryMb * fraction;
        }
        boolean shortOfMemory =
                seen.memAvailableMb != null && seen.memAvailableMb < LOW_AVAILABLE_MB;
        if (memoryHigh || shortOfMemory) {
            floor = 2;
            reason.setLength(0);
            if (memoryHigh) {
                reason.append("RSS ").append(f0(seen.rssMb)).append(" MB near the ")
                        .append(f0(config.memoryMb)).append(" MB budget");
            } else {
                reason.append("MemAvailable ").append(f0(seen.memAvailableMb)).append(" MB");
            }
        }
        return floor;
    }

    /** Why a watched figure is above {@code scale} × its budget ("" when none is). */
    private String over(Conditions seen, double scale) {
        if (config.powerW != null && seen.powerW != null && seen.powerW > config.powerW * scale) {
            return String.format(
                    Locale.ROOT, "power %.1f W over the %.1f W budget", seen.powerW, config.powerW);
        }
        Double budget = config.energyPerTokenJ;
        Double perToken = seen.energyPerTokenJ;
        if (budget != null && perToken != null && perToken > budget * scale) {
            return String.format(
                    Locale.ROOT, "%.3f J/token over the %.3f J budget", perToken, budget);
        }
        return "";
    }

    private void stepController(Conditions seen) {
        double now = seen.timeS;
        double hold = config.holdS;
        boolean settled = steppedAt == null || now - steppedAt >= hold;
        String over = over(seen, 1.0);
        if (!over.isEmpty()) {
            underSince = null;
            if (settled && controller < 2) {
                controller++;
                controllerReason = over;
                steppedAt = now;
            }
            return;
        }
        if (!over(seen, 1.0 - config.hysteresis).isEmpty()) {
            underSince = null; // inside the band: hold
            return;
        }
        if (underSince == null) {
            underSince = now;
        }
        if (controller > 0 && settled && now - underSince >= hold) {
            controller--;
            underSince = now;
            steppedAt = now;
        }
    }

    /** Takes new readings; returns the decision when the mode changes, else null. */
    public Decision update(Conditions seen, int round) {
        StringBuilder floorReason = new StringBuilder();
        int floor = floor(seen, floorReason);
        stepController(seen);
        int next = Math.max(floor, controller);
        if (next == level) {
            return null;
        }
        String reason;
        if (next > level) {
            reason = floor >= controller ? floorReason.toString() : controllerReason;
        } else {
            String cause =
                    Boolean.TRUE.equals(seen.plugged) ? "plugged in" : "conditions back within budget";
            String still = floor == next && floor > 0 ? "; still " + floorReason : "";
            reason = "recovered (" + cause + ")" + still;
        }
        level = next;
        Decision decision = new Decision(seen.timeS, round, mode(), reason);
        decisions.add(decision);
        return decision;
    }
}
