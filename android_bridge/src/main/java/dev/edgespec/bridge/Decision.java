package dev.edgespec.bridge;

/** The budget mode from round {@code round} on, and why. */
public final class Decision {
    public final double timeS;
    public final int round;
    public final String mode;
    public final String reason;

    public Decision(double timeS, int round, String mode, String reason) {
        this.timeS = timeS;
        this.round = round;
        this.mode = mode;
        this.reason = reason;
    }

    @Override
    public String toString() {
        return "round " + round + ": " + mode + " (" + reason + ")";
    }
}
