package dev.edgespec.bridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.Test;

/** tests/vectors/protocol_v1.json, the file the Python tests read too. */
public class WireVectorsTest {
    private final JSONObject vectors;
    private final int vocab;
    private final int maxLength;

    public WireVectorsTest() throws Exception {
        vectors = Vectors.load("protocol_v1.json");
        vocab = vectors.getInt("vocab_size");
        maxLength = vectors.getInt("max_length");
    }

    private JSONObject roundTrip(JSONObject vector) throws Exception {
        JSONObject json = vector.getJSONObject("json");
        String kind = vector.getString("kind");
        int k = vector.optInt("k", 8);
        switch (kind) {
            case "OpenRequest":
                return Wire.OpenRequest.fromJson(json, vocab, maxLength).toJson();
            case "OpenResponse":
                return Wire.OpenResponse.fromJson(json).toJson();
            case "VerifyRequest":
                Wire.VerifyRequest request = Wire.VerifyRequest.fromJson(json, vocab, maxLength);
                if (request.qDraft == null) {
                    return request.toJson(null);
                }
                JSONArray dense = vector.getJSONArray("q_draft_dense");
                for (int row = 0; row < dense.length(); row++) {
                    for (int id = 0; id < vocab; id++) {
                        assertEquals(
                                dense.getJSONArray(row).getDouble(id), request.qDraft[row][id], 0.0);
                    }
                }
                return request.toJson(json.getJSONObject("q_draft").getString("format"));
            case "VerifyResponse":
                return Wire.VerifyResponse.fromJson(json, k).toJson();
            case "ServerInfo":
                return Wire.ServerInfo.fromJson(json).toJson();
            default:
                throw new AssertionError("unknown kind " + kind);
        }
    }

    @Test
    public void validVectorsDecodeAndEncodeBack() throws Exception {
        JSONArray valid = vectors.getJSONArray("valid");
        assertTrue(valid.length() >= 9);
        for (int i = 0; i < valid.length(); i++) {
            JSONObject vector = valid.getJSONObject(i);
            JSONObject back = roundTrip(vector);
            assertTrue(
                    vector.getString("name") + ": " + back,
                    Vectors.same(vector.getJSONObject("json"), back));
        }
    }

    @Test
    public void invalidVectorsAreRefusedWithTheSameMessage() throws Exception {
        JSONArray invalid = vectors.getJSONArray("invalid");
        assertTrue(invalid.length() >= 17);
        for (int i = 0; i < invalid.length(); i++) {
            JSONObject vector = invalid.getJSONObject(i);
            JSONObject probe = new JSONObject(vector.toString());
            probe.put("k", 1);
            try {
                roundTrip(probe);
                fail(vector.getString("name") + " was accepted");
            } catch (WireException error) {
                String expected = vector.getString("error");
                assertTrue(
                        vector.getString("name") + ": '" + error.getMessage() + "' lacks '"
                                + expected + "'",
                        error.getMessage().contains(expected));
            }
        }
    }

    @Test
    public void uniformsUsedFollowsTheRejectionTest() {
        assertEquals(4, Wire.uniformsUsed(3, 3));
        assertEquals(2, Wire.uniformsUsed(0, 3));
        assertEquals(3, Wire.uniformsUsed(1, 3));
        assertEquals(1, Wire.uniformsUsed(0, 0));
    }

    @Test
    public void halfPrecisionRoundsToNearestEven() {
        float[] values = {0.0f, 0.125f, 1.0f / 3.0f, 65504.0f, 1e-7f, 6.1e-5f, 0.1f};
        short[] expected = {0x0000, 0x3000, 0x3555, 0x7bff, 0x0002, 0x03ff, 0x2e66};
        for (int i = 0; i < values.length; i++) {
            assertEquals("" + values[i], expected[i], QDraft.Half.fromFloat(values[i]));
        }
        assertEquals(0.125f, QDraft.Half.toFloat((short) 0x3000), 0.0f);
        assertEquals(65504.0f, QDraft.Half.toFloat((short) 0x7bff), 0.0f);
        assertEquals(2 * 0x1p-24f, QDraft.Half.toFloat((short) 0x0002), 0.0f);
    }

    @Test
    public void sparseQDraftIsExact() {
        double[][] rows = {{0.0, 0.1, 0.0, 0.9}, {0.3333333333333333, 0.0, 0.6666666666666667, 0.0}};
        JSONObject encoded = QDraft.encode(rows, "sparse");
        double[][] back = QDraft.decode(Json.parse(encoded.toString()), 2, 4);
        for (int row = 0; row < 2; row++) {
            assertArrayEquals(rows[row], back[row], 0.0);
        }
    }
}
