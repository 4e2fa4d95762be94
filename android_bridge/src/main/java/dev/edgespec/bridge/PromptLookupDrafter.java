package dev.edgespec.bridge;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Prompt lookup: no model, the context's own history is the draft (a port of the Python
 * {@code PromptLookupDrafter}, proposal for proposal).
 *
 * <p>{@code propose(k)} tries n-gram sizes from {@code maxNgram} down to {@code minNgram}: the
 * context's last n tokens are looked up among earlier, non-overlapping positions, and up to k
 * of the tokens that followed the most recent earlier copy are proposed. The index maps each
 * n-gram to its latest eligible start and grows on every commit.
 *
 * <p>With {@code coldK} above 0, a proposal is at most {@code coldK} tokens long unless the
 * previous one was accepted whole (a running copy), then up to k: the default constructor's 2
 * is the Python engine's {@code ngram} drafter ({@code LOOKUP_COLD_K}).
 */
public final class PromptLookupDrafter implements Drafter {
    private final int maxNgram;
    private final int minNgram;
    private final int coldK;
    private boolean streak; // was the last proposal accepted whole?
    private final List<Integer> context = new ArrayList<>();
    private final Map<List<Integer>, Integer> latest = new HashMap<>();
    private int[] indexed;
    private int[] proposal = new int[0];
    private boolean begun;

    public PromptLookupDrafter(int maxNgram, int minNgram) {
        this(maxNgram, minNgram, 0);
    }

    public PromptLookupDrafter(int maxNgram, int minNgram, int coldK) {
        if (coldK < 0) {
            throw new IllegalArgumentException(
                    "coldK=" + coldK + " is invalid: use 0 (no cap) or more");
        }
        if (minNgram < 1 || minNgram > maxNgram) {
            throw new IllegalArgumentException(
                    "n-gram sizes min_ngram=" + minNgram + ", max_ngram=" + maxNgram
                            + " are invalid: use 1 <= min_ngram <= max_ngram");
        }
        this.maxNgram = maxNgram;
        this.minNgram = minNgram;
        this.coldK = coldK;
    }

    public PromptLookupDrafter() {
        this(3, 1, 2);
    }

    @Override
    public void begin(int[] prompt, Sampling sampling) {
        context.clear();
        for (int token : prompt) {
            context.add(token);
        }
        latest.clear();
        indexed = new int[maxNgram + 1];
        proposal = new int[0];
        streak = false;
        begun = true;
        extendIndex();
    }

    @Override
    public Draft propose(int k) {
        requireBegun();
        if (k < 0) {
            throw new IllegalArgumentException("k must be >= 0, got " + k);
        }
        proposal = new int[0];
        if (k == 0) {
            return Draft.EMPTY;
        }
        if (coldK > 0 && !streak) {
            k = Math.min(k, coldK);
        }
        int length = context.size();
        for (int n = maxNgram; n >= minNgram; n--) {
            if (length < 2 * n) {
                continue; // no room for a tail and a non-overlapping earlier copy of it
            }
            Integer start = latest.get(new ArrayList<>(context.subList(length - n, length)));
            if (start != null) {
                int from = start + n;
                int to = Math.min(from + k, length);
                proposal = new int[to - from];
                for (int i = from; i < to; i++) {
                    proposal[i - from] = context.get(i);
                }
                return Draft.of(proposal);
            }
        }
        return Draft.EMPTY;
    }

    @Override
    public void commit(int nAccepted, int nextToken) {
        requireBegun();
        if (nAccepted < 0 || nAccepted > proposal.length) {
            throw new IllegalArgumentException(
                    "n_accepted=" + nAccepted + " is outside [0, " + proposal.length
                            + "], the length of the last proposal");
        }
        streak = proposal.length > 0 && nAccepted == proposal.length;
        for (int i = 0; i < nAccepted; i++) {
            context.add(proposal[i]);
        }
        context.add(nextToken);
        proposal = new int[0]; // a proposal is committed once
        extendIndex();
    }

    /** Indexes every start that became eligible: s + n <= length - n (no overlap with the tail). */
    private void extendIndex() {
        int length = context.size();
        for (int n = minNgram; n <= maxNgram; n++) {
            int eligible = length - 2 * n + 1;
            for (int start = indexed[n]; start < eligible; start++) {
                latest.put(new ArrayList<>(context.subList(start, start + n)), start);
            }
            indexed[n] = Math.max(indexed[n], eligible);
        }
    }

    private void requireBegun() {
        if (!begun) {
            throw new IllegalStateException("call begin(prompt, ...) before propose or commit");
        }
    }
}
