package android.os;

/** Compile-only stub of android.os.BatteryManager (API 21+ shape); never packaged or run. */
public class BatteryManager {
    public static final int BATTERY_PROPERTY_CURRENT_NOW = 2;
    public static final int BATTERY_PROPERTY_CAPACITY = 4;
    public static final String EXTRA_VOLTAGE = "voltage";
    public static final String EXTRA_PLUGGED = "plugged";

    public int getIntProperty(int id) {
        throw new RuntimeException("Stub!");
    }

    public long getLongProperty(int id) {
        throw new RuntimeException("Stub!");
    }
}
