package dev.edgespec.bridge;

/** What the probes saw at {@code timeS} (null: not known), as the Python {@code Conditions}. */
public final class Conditions {
    public final double timeS;
    public final Boolean plugged;
    public final Double batteryPct;
    public final Double powerW;
    public final Double rssMb;
    public final Double memAvailableMb;
    public final Double energyPerTokenJ;

    public Conditions(
            double timeS,
            Boolean plugged,
            Double batteryPct,
            Double powerW,
            Double rssMb,
            Double memAvailableMb,
            Double energyPerTokenJ) {
        this.timeS = timeS;
        this.plugged = plugged;
        this.batteryPct = batteryPct;
        this.powerW = powerW;
        this.rssMb = rssMb;
        this.memAvailableMb = memAvailableMb;
        this.energyPerTokenJ = energyPerTokenJ;
    }

    /** Reads the conditions between rounds; {@code tokens} = tokens committed so far. */
    public interface Source {
        Conditions read(int tokens);
    }
}
