package dev.edgespec.bridge;

/**
 * The root of the bridge's exceptions (unchecked, as in the Python package's one tree):
 *
 * <pre>
 * EdgespecException
 * ├── WireException               a protocol v1 message is malformed or out of range
 * ├── RemoteException             the server answered with a refusal (4xx) or nonsense
 * └── RemoteUnavailableException  the server did not answer after the retries; keeps the
 *                                 tokens committed before the failure
 * </pre>
 */
public class EdgespecException extends RuntimeException {
    public EdgespecException(String message) {
        super(message);
    }

    public EdgespecException(String message, Throwable cause) {
        super(message, cause);
    }
}
