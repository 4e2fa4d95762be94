package dev.edgespec.bridge.android;

import android.content.Context;
import android.content.Intent;
import android.content.IntentFilter;
import android.os.BatteryManager;
import dev.edgespec.bridge.BatteryMeter;

/**
 * Battery readings from Android's {@code BatteryManager} for {@link BatteryMeter}.
 *
 * <p>NOT EXERCISED HERE: this source set is compiled against compile-only stubs of the
 * Android classes (android_bridge/src/stubs, never packaged) and no test runs it; only its
 * shape is checked by the compiler. Charge comes from {@code BATTERY_PROPERTY_CAPACITY},
 * current from {@code BATTERY_PROPERTY_CURRENT_NOW} (µA; sign and availability vary between
 * vendors, {@code Integer.MIN_VALUE} when unsupported), voltage and plug state from the sticky
 * {@code ACTION_BATTERY_CHANGED} broadcast.
 */
public final class AndroidBattery implements BatteryMeter.Reader {
    private final Context context;
    private final BatteryManager battery;

    public AndroidBattery(Context context) {
        this.context = context;
        this.battery = (BatteryManager) context.getSystemService(Context.BATTERY_SERVICE);
    }

    @Override
    public BatteryMeter.Reading read() {
        Intent status = context.registerReceiver(null, new IntentFilter(Intent.ACTION_BATTERY_CHANGED));
        Boolean plugged = null;
        Double voltageMv = null;
        if (status != null) {
            plugged = status.getIntExtra(BatteryManager.EXTRA_PLUGGED, 0) != 0;
            int voltage = status.getIntExtra(BatteryManager.EXTRA_VOLTAGE, -1);
            voltageMv = voltage > 0 ? (double) voltage : null;
        }
        int percent = battery.getIntProperty(BatteryManager.BATTERY_PROPERTY_CAPACITY);
        long current = battery.getLongProperty(BatteryManager.BATTERY_PROPERTY_CURRENT_NOW);
        return new BatteryMeter.Reading(
                plugged,
                percent >= 0 && percent <= 100 ? (double) percent : null,
                current == Integer.MIN_VALUE || current == Long.MIN_VALUE ? null : (double) current,
                voltageMv);
    }
}
