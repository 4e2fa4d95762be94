package dev.edgespec.bridge;

import java.io.IOException;
import java.util.Map;

/** Sends one HTTP request. {@link HttpTransport} on a device; fakes in tests. */
public interface Transport {
    /** An answered request: status and body text. */
    final class Reply {
        public final int status;
        public final String body;

        public Reply(int status, String body) {
            this.status = status;
            this.body = body;
        }
    }

    /** {@code body} null: no body. Throws IOException when nothing was answered. */
    Reply send(String method, String url, String body, Map<String, String> headers)
            throws IOException;
}
