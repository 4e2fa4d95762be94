package android.content;

/** Compile-only stub of android.content.Intent; never packaged or run. */
public class Intent {
    public static final String ACTION_BATTERY_CHANGED = "android.intent.action.BATTERY_CHANGED";

    public int getIntExtra(String name, int defaultValue) {
        throw new RuntimeException("Stub!");
    }
}
