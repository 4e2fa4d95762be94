package dev.edgespec.bridge;

/**
 * The verification server did not answer after the retries. Raised before anything of the
 * failed round is committed; {@link #partialTokens()} holds the tokens the generation had
 * committed until then (empty when thrown by a single request).
 */
public final class RemoteUnavailableException extends EdgespecException {
    private final int[] partialTokens;

    public RemoteUnavailableException(String message, Throwable cause) {
        this(message, new int[0], cause);
    }

    public RemoteUnavailableException(String message, int[] partialTokens, Throwable cause) {
        super(message, cause);
        this.partialTokens = partialTokens.clone();
    }

    /** The same failure with the generation's committed tokens attached. */
    public RemoteUnavailableException withPartialTokens(int[] tokens) {
        return new RemoteUnavailableException(getMessage(), tokens, getCause());
    }

    public int[] partialTokens() {
        return partialTokens.clone();
    }
}
