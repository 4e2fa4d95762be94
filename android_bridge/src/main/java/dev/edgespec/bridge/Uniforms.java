package dev.edgespec.bridge;

import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.Random;

/**
 * The generation's stream of uniforms in [0, 1) for rejection rounds: a round sends the
 * k + 1 next ones ({@link #peek}) and then takes as many as the server's test used. Seeded
 * per generation; it is not numpy's generator, so a JVM client samples a different (equally
 * distributed) sequence than the Python client with the same seed.
 */
final class Uniforms {
    private final Random random;
    private final ArrayDeque<Double> ahead = new ArrayDeque<>();

    Uniforms(long seed) {
        random = new Random(seed);
    }

    double[] peek(int n) {
        while (ahead.size() < n) {
            ahead.addLast(random.nextDouble());
        }
        double[] values = new double[n];
        Iterator<Double> it = ahead.iterator();
        for (int i = 0; i < n; i++) {
            values[i] = it.next();
        }
        return values;
    }

    void take(int n) {
        peek(n);
        for (int i = 0; i < n; i++) {
            ahead.removeFirst();
        }
    }
}
