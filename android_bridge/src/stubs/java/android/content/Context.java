package android.content;

/** Compile-only stub of android.content.Context; never packaged or run. */
public abstract class Context {
    public static final String BATTERY_SERVICE = "batterymanager";

    public abstract Object getSystemService(String name);

    public abstract Intent registerReceiver(BroadcastReceiver receiver, IntentFilter filter);
}
