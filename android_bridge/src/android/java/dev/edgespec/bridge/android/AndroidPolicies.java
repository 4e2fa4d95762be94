package dev.edgespec.bridge.android;

import android.content.Context;
import dev.edgespec.bridge.AutoK;
import dev.edgespec.bridge.BatteryMeter;
import dev.edgespec.bridge.BudgetConfig;
import dev.edgespec.bridge.BudgetPolicy;
import dev.edgespec.bridge.BudgetedK;
import dev.edgespec.bridge.CostProfile;
import dev.edgespec.bridge.KPolicy;
import dev.edgespec.bridge.RemoteTarget;

/**
 * The k policy an app usually wants: RTT-aware auto k (seeded from the server's cost curve and
 * a measured round trip) under a battery budget read from {@code BatteryManager}.
 *
 * <p>NOT EXERCISED HERE (compiled against stubs, see {@link AndroidBattery}); call it off the
 * main thread, since it measures the round trip.
 */
public final class AndroidPolicies {
    private AndroidPolicies() {}

    public static KPolicy batteryAwareAutoK(
            Context context, RemoteTarget server, double draftStepS, double minBatteryPct) {
        CostProfile costs = CostProfile.remote(server.info(), server.measureRtt(3), draftStepS);
        BatteryMeter battery =
                new BatteryMeter(new AndroidBattery(context), AndroidPolicies::seconds);
        return new BudgetedK(
                new AutoK(costs, 8),
                new BudgetPolicy(BudgetConfig.battery(minBatteryPct), false),
                battery,
                AndroidPolicies::seconds);
    }

    private static double seconds() {
        return System.nanoTime() / 1e9;
    }
}
