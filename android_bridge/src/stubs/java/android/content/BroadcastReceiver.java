package android.content;

/** Compile-only stub of android.content.BroadcastReceiver; never packaged or run. */
public abstract class BroadcastReceiver {
    public abstract void onReceive(Context context, Intent intent);
}
