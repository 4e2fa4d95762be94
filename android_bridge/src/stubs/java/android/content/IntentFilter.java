package android.content;

/** Compile-only stub of android.content.IntentFilter; never packaged or run. */
public class IntentFilter {
    public IntentFilter(String action) {
        throw new RuntimeException("Stub!");
    }
}
