package dev.edgespec.bridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.Test;

/** tests/vectors/policy_v1.json: the Python k and budget policies, step for step. */
public class PolicyVectorsTest {
    private static final double TOLERANCE = 1e-12;
    private final JSONObject vectors;

    public PolicyVectorsTest() throws Exception {
        vectors = Vectors.load("policy_v1.json");
    }

    private static double[] doubles(JSONArray array) throws Exception {
        double[] values = new double[array.length()];
        for (int i = 0; i < values.length; i++) {
            values[i] = array.getDouble(i);
        }
        return values;
    }

    private static CostProfile profile(JSONObject data) throws Exception {
        return new CostProfile(
                data.getDouble("target_step_s"),
                data.getDouble("draft_step_s"),
                doubles(data.getJSONArray("verify_cost")));
    }

    @Test
    public void expectedTokens() throws Exception {
        JSONArray cases = vectors.getJSONArray("expected_tokens");
        for (int i = 0; i < cases.length(); i++) {
            JSONObject c = cases.getJSONObject(i);
            assertEquals(
                    c.getDouble("expected"),
                    CostProfile.expectedTokens(c.getDouble("alpha"), c.getInt("k")),
                    TOLERANCE);
        }
    }

    @Test
    public void remoteProfilesPayTheRoundTrip() throws Exception {
        JSONArray cases = vectors.getJSONArray("remote_profile");
        for (int i = 0; i < cases.length(); i++) {
            JSONObject c = cases.getJSONObject(i);
            JSONObject server = c.getJSONObject("info");
            Wire.ServerInfo info =
                    new Wire.ServerInfo(
                            8, 64, new int[0], "", 8, server.getDouble("target_step_s"),
                            doubles(server.getJSONArray("verify_cost")));
            CostProfile got = CostProfile.remote(info, c.getDouble("rtt_s"), c.getDouble("draft_step_s"));
            CostProfile expected = profile(c.getJSONObject("expected"));
            assertEquals(expected.targetStepS, got.targetStepS, TOLERANCE);
            assertEquals(expected.draftStepS, got.draftStepS, TOLERANCE);
            assertArrayEquals(expected.verifyCost, got.verifyCost, TOLERANCE);
        }
    }

    @Test
    public void autoKChoosesTheSameKAsPython() throws Exception {
        JSONArray scenarios = vectors.getJSONArray("auto_k");
        for (int s = 0; s < scenarios.length(); s++) {
            JSONObject scenario = scenarios.getJSONObject(s);
            String name = scenario.getString("name");
            AutoK policy =
                    new AutoK(
                            profile(scenario.getJSONObject("profile")),
                            scenario.getInt("k_max"),
                            scenario.getDouble("alpha"),
                            scenario.getDouble("smoothing"),
                            scenario.getInt("probe_every"));
            JSONArray steps = scenario.getJSONArray("steps");
            for (int i = 0; i < steps.length(); i++) {
                JSONObject step = steps.getJSONObject(i);
                if (step.has("next_k")) {
                    assertEquals(name + " step " + i, step.getInt("next_k"), policy.nextK());
                    continue;
                }
                JSONObject r = step.getJSONObject("observe");
                int n = r.getInt("n_accepted");
                policy.observe(
                        new StepRecord(
                                i / 2, r.getInt("drafted"), r.getInt("drafted"), n, new int[n + 1],
                                r.getDouble("draft_s"), r.getInt("drafted"), r.getDouble("verify_s")));
                assertEquals(name + " step " + i, step.getDouble("alpha"), policy.alpha(), TOLERANCE);
            }
        }
    }

    @Test
    public void budgetPolicyDecidesAsPython() throws Exception {
        JSONArray scenarios = vectors.getJSONArray("budget");
        for (int s = 0; s < scenarios.length(); s++) {
            JSONObject scenario = scenarios.getJSONObject(s);
            String name = scenario.getString("name");
            JSONObject c = scenario.getJSONObject("config");
            BudgetConfig config =
                    new BudgetConfig(
                            Vectors.optDouble(c, "memory_mb"),
                            Vectors.optDouble(c, "power_w"),
                            Vectors.optDouble(c, "energy_per_token_j"),
                            Vectors.optDouble(c, "min_battery_pct"),
                            c.getDouble("hold_s"),
                            c.getDouble("hysteresis"),
                            c.getDouble("check_every_s"));
            BudgetPolicy policy = new BudgetPolicy(config, scenario.getBoolean("remote_available"));
            JSONArray steps = scenario.getJSONArray("steps");
            for (int i = 0; i < steps.length(); i++) {
                JSONObject step = steps.getJSONObject(i);
                JSONObject seen = step.getJSONObject("conditions");
                Conditions conditions =
                        new Conditions(
                                seen.getDouble("time_s"),
                                seen.has("plugged") ? seen.getBoolean("plugged") : null,
                                Vectors.optDouble(seen, "battery_pct"),
                                Vectors.optDouble(seen, "power_w"),
                                Vectors.optDouble(seen, "rss_mb"),
                                Vectors.optDouble(seen, "mem_available_mb"),
                                Vectors.optDouble(seen, "energy_per_token_j"));
                Decision decision = policy.update(conditions, step.getInt("round"));
                String where = name + " step " + i;
                if (step.isNull("decision")) {
                    assertNull(where, decision);
                } else {
                    assertEquals(where, step.getString("decision"), decision.reason);
                    assertEquals(where, step.getString("mode"), decision.mode);
                }
                assertEquals(where, step.getString("mode"), policy.mode());
                JSONArray caps = step.getJSONArray("cap");
                for (int j = 0; j < caps.length(); j++) {
                    JSONArray pair = caps.getJSONArray(j);
                    assertEquals(where, pair.getInt(1), policy.cap(pair.getInt(0)));
                }
            }
        }
    }
}
