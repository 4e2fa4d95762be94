package dev.edgespec.bridge;

import java.util.Base64;
import org.json.JSONArray;
import org.json.JSONObject;

/**
 * q_draft on the wire: {@code sparse} (ids and float64 probabilities of the nonzero entries,
 * exact) or {@code fp16} rows (base64, little-endian). Rows are dense {@code double[k][vocab]}
 * here, as in the Python module.
 */
public final class QDraft {
    private QDraft() {}

    public static JSONObject encode(double[][] rows, String format) {
        JSONObject data = new JSONObject();
        Json.put(data, "format", format);
        if ("sparse".equals(format)) {
            JSONArray ids = new JSONArray();
            JSONArray probs = new JSONArray();
            for (double[] row : rows) {
                int nonzero = 0;
                for (double p : row) {
                    nonzero += p != 0.0 ? 1 : 0;
                }
                int[] rowIds = new int[nonzero];
                double[] rowProbs = new double[nonzero];
                for (int id = 0, j = 0; id < row.length; id++) {
                    if (row[id] != 0.0) {
                        rowIds[j] = id;
                        rowProbs[j++] = row[id];
                    }
                }
                ids.put(Json.array(rowIds));
                probs.put(Json.array(rowProbs));
            }
            Json.put(data, "ids", ids);
            return Json.put(data, "probs", probs);
        }
        if ("fp16".equals(format)) {
            int vocab = rows.length == 0 ? 0 : rows[0].length;
            byte[] packed = new byte[2 * rows.length * vocab];
            int at = 0;
            for (double[] row : rows) {
                for (double p : row) {
                    short half = Half.fromFloat((float) p);
                    packed[at++] = (byte) half;
                    packed[at++] = (byte) (half >> 8);
                }
            }
            Json.put(data, "vocab_size", vocab);
            return Json.put(data, "rows", Base64.getEncoder().encodeToString(packed));
        }
        throw new IllegalArgumentException("unknown q_draft format '" + format + "'");
    }

    /** [k][vocabSize] rows, each nonnegative with a positive sum. */
    public static double[][] decode(Object value, int k, int vocabSize) {
        if (!(value instanceof JSONObject)) {
            throw new WireException("'q_draft' must be an object");
        }
        JSONObject data = (JSONObject) value;
        Object format = data.opt("format");
        double[][] rows = new double[k][vocabSize];
        if ("sparse".equals(format)) {
            JSONArray ids = Json.listField(data, "ids");
            JSONArray probs = Json.listField(data, "probs");
            if (ids.length() != k || probs.length() != k) {
                throw new WireException(
                        "'q_draft' must have k = " + k + " rows of ids and of probs");
            }
            for (int row = 0; row < k; row++) {
                int[] rowIds = Json.tokenIds("q_draft.ids", ids.opt(row), vocabSize);
                Object rowProbs = probs.opt(row);
                if (!(rowProbs instanceof JSONArray)
                        || ((JSONArray) rowProbs).length() != rowIds.length) {
                    throw new WireException(
                            "q_draft row " + row + ": ids and probs differ in length");
                }
                double[] p = Json.numbers("q_draft.probs", rowProbs);
                for (int j = 0; j < rowIds.length; j++) {
                    rows[row][rowIds[j]] = p[j];
                }
            }
        } else if ("fp16".equals(format)) {
            byte[] raw;
            try {
                raw = Base64.getDecoder().decode(Json.stringField(data, "rows"));
            } catch (IllegalArgumentException error) {
                throw new WireException("'q_draft.rows' is not valid base64");
            }
            if (raw.length != 2 * k * vocabSize) {
                throw new WireException(
                        "'q_draft.rows' holds " + raw.length + " bytes, not 2 x " + k + " x "
                                + vocabSize);
            }
            for (int i = 0; i < k * vocabSize; i++) {
                short half = (short) ((raw[2 * i] & 0xff) | (raw[2 * i + 1] << 8));
                rows[i / vocabSize][i % vocabSize] = Half.toFloat(half);
            }
        } else {
            throw new WireException(
                    "'q_draft.format' must be one of ('sparse', 'fp16'), not " + format);
        }
        for (double[] row : rows) {
            double sum = 0.0;
            for (double p : row) {
                if (Double.isNaN(p) || Double.isInfinite(p) || p < 0.0) {
                    throw new WireException(
                            "q_draft probabilities must be finite and nonnegative");
                }
                sum += p;
            }
            if (!(sum > 0.0) || Double.isInfinite(sum)) {
                throw new WireException("every q_draft row needs a positive sum");
            }
        }
        return rows;
    }

    /** IEEE 754 binary16 conversions (Java 8 has none; Float.float16ToFloat is Java 20). */
    static final class Half {
        private Half() {}

        static float toFloat(short half) {
            int bits = half & 0xffff;
            int sign = (bits & 0x8000) << 16;
            int exponent = (bits >>> 10) & 0x1f;
            int mantissa = bits & 0x3ff;
            if (exponent == 0x1f) {
                return Float.intBitsToFloat(sign | 0x7f800000 | (mantissa << 13));
            }
            if (exponent == 0) {
                float value = mantissa * 0x1p-24f;
                return sign == 0 ? value : -value;
            }
            return Float.intBitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
        }

        /** Round to nearest, ties to even (what numpy's astype(float16) does). */
        static short fromFloat(float value) {
            int bits = Float.floatToIntBits(value);
            int sign = (bits >>> 16) & 0x8000;
            float magnitude = Math.abs(value);
            if (Float.isNaN(value)) {
                return (short) (sign | 0x7e00);
            }
            if (magnitude >= 65520.0f) {
                return (short) (sign | 0x7c00);
            }
            if (magnitude < 0x1p-14f) {
                // Subnormal: units of 2^-24, rounded half to even by Math.rint.
                return (short) (sign | (int) Math.rint(magnitude * 0x1p24f));
            }
            int exponent = ((bits >>> 23) & 0xff) - 127 + 15;
            int mantissa = bits & 0x7fffff;
            int kept = mantissa >>> 13;
            int rest = mantissa & 0x1fff;
            int half = (exponent << 10) | kept;
            if (rest > 0x1000 || (rest == 0x1000 && (kept & 1) == 1)) {
                half++; // a carry into the exponent is still the right number
            }
            return (short) (sign | half);
        }
    }
}
