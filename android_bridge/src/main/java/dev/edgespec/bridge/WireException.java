package dev.edgespec.bridge;

/** A protocol v1 message is malformed or out of range (the Python side's {@code WireError}). */
public final class WireException extends EdgespecException {
    public WireException(String message) {
        super(message);
    }
}
