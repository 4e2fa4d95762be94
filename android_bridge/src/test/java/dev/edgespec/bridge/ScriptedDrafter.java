package dev.edgespec.bridge;

/** Proposes the target's own tokens for the first {@code right} positions, then wrong ones. */
final class ScriptedDrafter implements Drafter {
    private final int right;
    private int[] context;
    private int length;
    private int[] proposal = new int[0];

    ScriptedDrafter(int right) {
        this.right = right;
    }

    @Override
    public void begin(int[] prompt, Sampling sampling) {
        context = java.util.Arrays.copyOf(prompt, prompt.length + 4096);
        length = prompt.length;
    }

    @Override
    public Draft propose(int k) {
        int[] tokens = FakeServer.greedy(java.util.Arrays.copyOf(context, length), k);
        for (int i = right; i < k; i++) {
            tokens[i] = (tokens[i] + 1) % FakeServer.VOCAB;
        }
        proposal = tokens;
        return Draft.of(tokens);
    }

    @Override
    public void commit(int nAccepted, int nextToken) {
        System.arraycopy(proposal, 0, context, length, nAccepted);
        length += nAccepted;
        context[length++] = nextToken;
    }
}
