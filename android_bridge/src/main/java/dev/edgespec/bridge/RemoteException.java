package dev.edgespec.bridge;

/** The verification server refused a request (HTTP 4xx) or answered with a malformed body. */
public class RemoteException extends EdgespecException {
    private final int status;

    public RemoteException(String message, int status) {
        super(message);
        this.status = status;
    }

    /** The HTTP status, or 0 when the answer itself was malformed. */
    public int status() {
        return status;
    }
}
