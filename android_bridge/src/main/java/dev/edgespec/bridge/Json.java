package dev.edgespec.bridge;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/** Typed reads and unchecked writes over {@code org.json}, with the Python side's messages. */
final class Json {
    private Json() {}

    static JSONObject parse(String text) {
        try {
            return new JSONObject(text);
        } catch (JSONException error) {
            throw new WireException("the body is not a JSON object: " + error.getMessage());
        }
    }

    static JSONObject put(JSONObject object, String name, Object value) {
        try {
            return object.put(name, value);
        } catch (JSONException error) {
            throw new WireException("cannot write '" + name + "': " + error.getMessage());
        }
    }

    static JSONArray array(int[] values) {
        JSONArray array = new JSONArray();
        for (int value : values) {
            array.put(value);
        }
        return array;
    }

    static JSONArray array(double[] values) {
        JSONArray array = new JSONArray();
        for (double value : values) {
            try {
                array.put(value);
            } catch (JSONException error) {
                throw new WireException("cannot write " + value + ": " + error.getMessage());
            }
        }
        return array;
    }

    private static Object raw(JSONObject data, String name) {
        if (!data.has(name) || data.isNull(name)) {
            throw new WireException("'" + name + "' is missing");
        }
        return data.opt(name);
    }

    private static WireException wrongType(String name, String kind, Object value) {
        String actual = value instanceof Boolean ? "a boolean" : typeName(value);
        return new WireException("'" + name + "' must be " + kind + ", not " + actual);
    }

    private static String typeName(Object value) {
        if (value instanceof String) {
            return "str";
        }
        if (value instanceof Number) {
            return isInteger(value) ? "int" : "float";
        }
        if (value instanceof JSONArray) {
            return "list";
        }
        if (value instanceof JSONObject) {
            return "dict";
        }
        return value.getClass().getSimpleName();
    }

    static boolean isInteger(Object value) {
        return value instanceof Integer || value instanceof Long;
    }

    static long longField(JSONObject data, String name) {
        Object value = raw(data, name);
        if (!isInteger(value)) {
            throw wrongType(name, "int", value);
        }
        return ((Number) value).longValue();
    }

    static int intField(JSONObject data, String name) {
        long value = longField(data, name);
        if (value < Integer.MIN_VALUE || value > Integer.MAX_VALUE) {
            throw new WireException("'" + name + "' = " + value + " does not fit in 32 bits");
        }
        return (int) value;
    }

    static double numberField(JSONObject data, String name) {
        Object value = raw(data, name);
        if (!(value instanceof Number)) {
            throw wrongType(name, "int or float", value);
        }
        return ((Number) value).doubleValue();
    }

    static String stringField(JSONObject data, String name) {
        Object value = raw(data, name);
        if (!(value instanceof String)) {
            throw wrongType(name, "str", value);
        }
        return (String) value;
    }

    static JSONArray listField(JSONObject data, String name) {
        Object value = raw(data, name);
        if (!(value instanceof JSONArray)) {
            throw wrongType(name, "list", value);
        }
        return (JSONArray) value;
    }

    static JSONObject objectField(JSONObject data, String name) {
        Object value = raw(data, name);
        if (!(value instanceof JSONObject)) {
            throw wrongType(name, "dict", value);
        }
        return (JSONObject) value;
    }

    /** Token ids in [0, vocabSize) ({@code vocabSize} &lt;= 0: no upper bound). */
    static int[] tokenIds(String name, Object values, int vocabSize) {
        if (!(values instanceof JSONArray)) {
            throw new WireException("'" + name + "' must be a list of token ids");
        }
        JSONArray array = (JSONArray) values;
        int[] ids = new int[array.length()];
        for (int i = 0; i < ids.length; i++) {
            Object value = array.opt(i);
            if (!isInteger(value)) {
                throw new WireException("'" + name + "' must hold integers only");
            }
            long id = ((Number) value).longValue();
            if (id < 0 || (vocabSize > 0 && id >= vocabSize)) {
                throw new WireException(
                        "token id " + id + " in '" + name + "' is outside [0, " + vocabSize + ")");
            }
            ids[i] = (int) id;
        }
        return ids;
    }

    static double[] numbers(String name, Object values) {
        if (!(values instanceof JSONArray)) {
            throw new WireException("'" + name + "' must be a list of numbers");
        }
        JSONArray array = (JSONArray) values;
        double[] numbers = new double[array.length()];
        for (int i = 0; i < numbers.length; i++) {
            Object value = array.opt(i);
            if (!(value instanceof Number)) {
                throw new WireException("'" + name + "' must hold numbers only");
            }
            numbers[i] = ((Number) value).doubleValue();
        }
        return numbers;
    }
}
