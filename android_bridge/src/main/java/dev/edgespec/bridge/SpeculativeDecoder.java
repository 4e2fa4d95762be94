package dev.edgespec.bridge;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * The speculative loop on the device: the {@link Drafter} proposes k tokens, the remote target
 * verifies {@code [last] + draft} in one pass, the drafter commits, the k policy observes.
 * Greedy output is token-identical to the target's own greedy decoding whatever the drafter
 * proposes; so is "match" sampling with the same seed.
 *
 * <p>When the server stays unreachable, {@link RemoteUnavailableException} is thrown with the
 * tokens committed before the failed round ({@code partialTokens()}): nothing is lost.
 */
public final class SpeculativeDecoder {
    /** Called after every round (streaming, progress, tests). */
    public interface RoundListener {
        void onRound(StepRecord record);
    }

    /** A finished generation: new tokens, why it stopped, its rounds and the session stats. */
    public static final class Generation {
        public final int[] tokens;
        public final String finishReason;
        public final List<StepRecord> rounds;
        public final int reopens;
        public final int retries;
        public final int roundTrips;
        public final double rttShare;

        Generation(int[] tokens, String finishReason, List<StepRecord> rounds, RemoteSession s) {
            this.tokens = tokens;
            this.finishReason = finishReason;
            this.rounds = Collections.unmodifiableList(rounds);
            this.reopens = s.reopens();
            this.retries = s.retries();
            this.roundTrips = s.roundTrips();
            this.rttShare = s.rttShare();
        }

        /** Accepted / drafted tokens over all rounds (0 when nothing was drafted). */
        public double acceptance() {
            int drafted = 0;
            int accepted = 0;
            for (StepRecord record : rounds) {
                drafted += record.drafted;
                accepted += record.nAccepted;
            }
            return drafted == 0 ? 0.0 : (double) accepted / drafted;
        }
    }

    private final RemoteTarget target;
    private final String qFormat;
    private final boolean followServerK;

    public SpeculativeDecoder(RemoteTarget target) {
        this(target, null, false);
    }

    /**
     * {@code followServerK}: never draft more than the server's latest suggested k (its max_k
     * divided by its queue), as the Python engine does under {@code k = "auto"}.
     */
    public SpeculativeDecoder(RemoteTarget target, String qFormat, boolean followServerK) {
        this.target = target;
        this.qFormat = qFormat;
        this.followServerK = followServerK;
    }

    public Generation generate(
            int[] prompt,
            Drafter drafter,
            KPolicy kPolicy,
            Sampling sampling,
            int maxNewTokens,
            RoundListener listener) {
        Wire.ServerInfo info = target.info();
        if (maxNewTokens < 1) {
            throw new IllegalArgumentException("max_new_tokens is " + maxNewTokens);
        }
        if (prompt.length + maxNewTokens > info.maxLength) {
            throw new IllegalArgumentException(
                    "the prompt (" + prompt.length + " tokens) plus max_new_tokens ("
                            + maxNewTokens + ") exceeds the context limit of " + info.maxLength
                            + " tokens");
        }
        Set<Integer> eos = new HashSet<>();
        for (int id : info.eosTokenIds) {
            eos.add(id);
        }
        int kLimit = Math.min(info.maxK, Wire.MAX_K);
        int[] produced = new int[maxNewTokens];
        int count = 0;
        List<StepRecord> rounds = new ArrayList<>();
        try (RemoteSession session = new RemoteSession(target, qFormat)) {
            session.begin(prompt, sampling);
            drafter.begin(prompt, sampling);
            int last = prompt[prompt.length - 1];
            while (count < maxNewTokens) {
                // A round commits up to k + 1 tokens: never draft past the token budget.
                int wanted = Math.min(kPolicy.nextK(), kLimit);
                if (followServerK) {
                    wanted = Math.min(wanted, session.suggestedK());
                }
                int k = Math.min(wanted, maxNewTokens - count - 1);
                Draft draft = drafter.propose(k);
                Verdict verdict;
                try {
                    verdict = session.verify(last, draft);
                } catch (RemoteUnavailableException error) {
                    throw error.withPartialTokens(Arrays.copyOf(produced, count));
                }
                drafter.commit(verdict.nAccepted, verdict.tokens[verdict.tokens.length - 1]);
                int take = Math.min(verdict.tokens.length, maxNewTokens - count);
                int eosAt = -1;
                for (int i = 0; i < take && eosAt < 0; i++) {
                    eosAt = eos.contains(verdict.tokens[i]) ? i : -1;
                }
                int[] committed = Arrays.copyOf(verdict.tokens, eosAt >= 0 ? eosAt + 1 : take);
                System.arraycopy(committed, 0, produced, count, committed.length);
                count += committed.length;
                last = verdict.tokens[verdict.tokens.length - 1];
                StepRecord record =
                        new StepRecord(
                                rounds.size(),
                                k,
                                draft.tokens.length,
                                verdict.nAccepted,
                                committed,
                                draft.elapsedS,
                                draft.steps,
                                verdict.elapsedS);
                rounds.add(record);
                kPolicy.observe(record);
                if (listener != null) {
                    listener.onRound(record);
                }
                if (eosAt >= 0) {
                    return new Generation(
                            Arrays.copyOf(produced, count), "eos", rounds, session);
                }
            }
            return new Generation(
                    Arrays.copyOf(produced, count), "max_new_tokens", rounds, session);
        }
    }
}
