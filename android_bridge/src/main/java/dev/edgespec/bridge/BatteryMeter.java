package dev.edgespec.bridge;

import java.util.function.DoubleSupplier;

/**
 * Budget {@link Conditions} from battery readings: plugged state, charge, and the draw
 * |current| × voltage in watts; energy per token integrates the draw over time (trapezoids)
 * since the first read and divides by the tokens committed since then. The readings come
 * from a {@link Reader}: {@code dev.edgespec.bridge.android.AndroidBattery} on a phone
 * (Android's {@code BatteryManager}), a fake in tests.
 */
public final class BatteryMeter implements Conditions.Source {
    /** One battery reading; null fields are not known. */
    public static final class Reading {
        public final Boolean plugged;
        public final Double percent;
        public final Double currentUa;
        public final Double voltageMv;

        public Reading(Boolean plugged, Double percent, Double currentUa, Double voltageMv) {
            this.plugged = plugged;
            this.percent = percent;
            this.currentUa = currentUa;
            this.voltageMv = voltageMv;
        }

        /** |current| × voltage in watts (the sign of current_now differs between vendors). */
        public Double powerW() {
            if (currentUa == null || voltageMv == null) {
                return null;
            }
            return Math.abs(currentUa) * voltageMv / 1e9;
        }
    }

    public interface Reader {
        Reading read();
    }

    private final Reader reader;
    private final DoubleSupplier clock;
    private double energyJ;
    private Double lastTimeS;
    private Double lastPowerW;
    private int firstTokens = -1;

    public BatteryMeter(Reader reader, DoubleSupplier clock) {
        this.reader = reader;
        this.clock = clock;
    }

    @Override
    public Conditions read(int tokens) {
        Reading reading = reader.read();
        double now = clock.getAsDouble();
        Double power = reading.powerW();
        if (power != null && lastPowerW != null && lastTimeS != null) {
            energyJ += 0.5 * (power + lastPowerW) * (now - lastTimeS);
        }
        if (power != null) {
            lastPowerW = power;
            lastTimeS = now;
            if (firstTokens < 0) {
                firstTokens = tokens;
            }
        }
        int spent = firstTokens < 0 ? 0 : tokens - firstTokens;
        Double perToken = spent > 0 ? energyJ / spent : null;
        return new Conditions(now, reading.plugged, reading.percent, power, null, null, perToken);
    }
}
