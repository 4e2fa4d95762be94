package dev.edgespec.bridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.util.Arrays;
import org.json.JSONObject;
import org.junit.Test;

/** The loop and the remote session against the in-process {@link FakeServer}. */
public class DecoderTest {
    private static final int[] PROMPT = {3, 9, 27, 3, 9, 27, 3, 9, 5, 12};
    private final FakeServer server = new FakeServer(null);
    private final RemoteTarget target =
            new RemoteTarget("http://fake:1", null, server, 3, 10, millis -> {});

    private SpeculativeDecoder.Generation run(Drafter drafter, int k, int n,
            SpeculativeDecoder.RoundListener listener) {
        return new SpeculativeDecoder(target)
                .generate(PROMPT, drafter, KPolicy.fixed(k), Sampling.GREEDY, n, listener);
    }

    @Test
    public void greedyOutputIsTheTargetsForEveryKAndDrafter() {
        int[] expected = FakeServer.greedy(PROMPT, 40);
        for (int k = 0; k <= 8; k++) {
            for (int right = 0; right <= k; right++) {
                SpeculativeDecoder.Generation generation = run(new ScriptedDrafter(right), k, 40, null);
                assertArrayEquals("k=" + k + " right=" + right, expected, generation.tokens);
                for (StepRecord record : generation.rounds.subList(0, generation.rounds.size() - 1)) {
                    assertEquals(Math.min(right, record.drafted), record.nAccepted);
                }
            }
            assertArrayEquals(expected, run(new PromptLookupDrafter(), k, 40, null).tokens);
        }
    }

    @Test
    public void fullyRightDraftsCommitKPlusOneTokensPerRound() {
        SpeculativeDecoder.Generation generation = run(new ScriptedDrafter(99), 4, 40, null);
        assertEquals(8, generation.rounds.size());
        assertEquals(1.0, generation.acceptance(), 0.0);
        assertEquals("max_new_tokens", generation.finishReason);
    }

    @Test
    public void lostSessionsAreReopenedFromTheClientHistory() {
        int[] expected = FakeServer.greedy(PROMPT, 30);
        SpeculativeDecoder.Generation generation =
                run(new ScriptedDrafter(2), 4, 30, record -> {
                    if (record.round % 3 == 1) {
                        server.restart();
                    }
                });
        assertArrayEquals(expected, generation.tokens);
        assertTrue(generation.reopens >= 3);
    }

    @Test
    public void transientFailuresAreRetried() {
        int[] expected = FakeServer.greedy(PROMPT, 20);
        SpeculativeDecoder.Generation generation =
                run(new ScriptedDrafter(1), 3, 20, record -> {
                    if (record.round == 2) {
                        server.failures = 2;
                    }
                });
        assertArrayEquals(expected, generation.tokens);
        assertEquals(2, generation.retries);
    }

    @Test
    public void anUnreachableServerKeepsThePartialTokens() {
        int[] expected = FakeServer.greedy(PROMPT, 40);
        int[] committed = new int[1];
        try {
            run(new ScriptedDrafter(2), 4, 40, record -> {
                committed[0] += record.committed.length;
                if (record.round == 3) {
                    server.down = true;
                }
            });
            fail("the generation went on without a server");
        } catch (RemoteUnavailableException error) {
            assertEquals(12, committed[0]);
            assertArrayEquals(Arrays.copyOf(expected, 12), error.partialTokens());
            assertTrue(error.getMessage(), error.getMessage().contains("after 4 attempt(s)"));
        }
    }

    @Test
    public void theApiKeyTravelsAsABearerToken() {
        FakeServer guarded = new FakeServer("s3cret");
        RemoteTarget without = new RemoteTarget("http://fake:1", null, guarded, 0, 0, m -> {});
        try {
            without.info();
            fail("no key was accepted");
        } catch (RemoteException error) {
            assertEquals(401, error.status());
        }
        RemoteTarget with = new RemoteTarget("http://fake:1", "s3cret", guarded, 0, 0, m -> {});
        int[] tokens = new SpeculativeDecoder(with)
                .generate(PROMPT, new PromptLookupDrafter(), KPolicy.fixed(3), Sampling.GREEDY, 10, null)
                .tokens;
        assertArrayEquals(FakeServer.greedy(PROMPT, 10), tokens);
    }

    @Test
    public void retriesFollowTheDeadlineWithJitteredBackoff() {
        server.down = true;
        RemoteTarget patient =
                new RemoteTarget("http://fake:1", null, server, Integer.MAX_VALUE, 1,
                        millis -> Thread.sleep(Math.max(millis, 1)), 200);
        try {
            patient.request("GET", "/health", null, true);
            fail("a server that stays down answered");
        } catch (RemoteUnavailableException error) {
            assertTrue(server.requests > 5); // the deadline, not a count, ended the retries
        }
        for (int attempts = 1; attempts < 30; attempts++) {
            long ceiling = Math.min(RemoteTarget.MAX_BACKOFF_MS, 1L << Math.min(attempts - 1, 20));
            long pause = patient.backoff(attempts);
            assertTrue(pause >= ceiling / 2 && pause <= ceiling);
        }
    }

    @Test
    public void sessionsNeedTheirSecret() {
        RemoteSession owner = new RemoteSession(target);
        owner.begin(PROMPT, Sampling.GREEDY);
        String rounds = "/v1/verify/sessions/s0/rounds";
        JSONObject round =
                new Wire.VerifyRequest(PROMPT.length - 1, PROMPT[PROMPT.length - 1], new int[0],
                        null, new double[0]).toJson(null);
        assertEquals(404, target.request("POST", rounds, round, false).status);
        assertEquals(404, target.request("DELETE", "/v1/verify/sessions/s0", null, false).status);
        Verdict verdict = owner.verify(PROMPT[PROMPT.length - 1], Draft.EMPTY);
        assertArrayEquals(FakeServer.greedy(PROMPT, 1), verdict.tokens);
        owner.close();
    }

    @Test
    public void followingTheServerCapsK() {
        server.suggestedK = 2;
        SpeculativeDecoder.Generation generation =
                new SpeculativeDecoder(target, null, true)
                        .generate(PROMPT, new ScriptedDrafter(99), KPolicy.fixed(6), Sampling.GREEDY, 20, null);
        assertArrayEquals(FakeServer.greedy(PROMPT, 20), generation.tokens);
        for (StepRecord record : generation.rounds) {
            assertTrue(record.k <= 2);
        }
    }

    @Test
    public void refusesPromptsPastTheContext() {
        try {
            run(new PromptLookupDrafter(), 2, FakeServer.MAX_LENGTH, null);
            fail("accepted a generation past the context");
        } catch (IllegalArgumentException error) {
            assertTrue(error.getMessage().contains("exceeds the context limit"));
        }
    }

    @Test
    public void promptLookupProposesWhatFollowedTheLatestMatch() {
        PromptLookupDrafter drafter = new PromptLookupDrafter(3, 1);
        drafter.begin(new int[] {1, 2, 3, 4, 1, 2, 3, 9, 1, 2, 3}, Sampling.GREEDY);
        assertArrayEquals(new int[] {9, 1}, drafter.propose(2).tokens);
        drafter.commit(1, 7); // context ... 1 2 3 9 7
        assertArrayEquals(new int[0], drafter.propose(3).tokens);
        drafter.commit(0, 2); // ... 9 7 2: the 1-gram "2" matched earlier
        assertArrayEquals(new int[] {3, 9, 7}, drafter.propose(3).tokens);
    }

    @Test
    public void coldKCapsProposalsUntilOneIsAcceptedWhole() {
        PromptLookupDrafter drafter = new PromptLookupDrafter();
        drafter.begin(new int[] {1, 2, 3, 4, 5, 6, 7, 1}, Sampling.GREEDY);
        assertArrayEquals(new int[] {2, 3}, drafter.propose(5).tokens); // a fresh match
        drafter.commit(2, 4); // accepted whole: the copy runs on
        assertArrayEquals(new int[] {5, 6, 7, 1, 2}, drafter.propose(5).tokens);
        drafter.commit(1, 9); // a miss
        assertArrayEquals(new int[0], drafter.propose(5).tokens);
        drafter.commit(0, 1);
        assertArrayEquals(new int[] {2, 3}, drafter.propose(5).tokens); // cold again
    }
}
