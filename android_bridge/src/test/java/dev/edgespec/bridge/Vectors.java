package dev.edgespec.bridge;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Iterator;
import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

/** The shared JSON vectors (tests/vectors, passed as -Dedgespec.vectors) and JSON equality. */
final class Vectors {
    private Vectors() {}

    static JSONObject load(String name) throws IOException {
        String dir = System.getProperty("edgespec.vectors", "../tests/vectors");
        Path path = Paths.get(dir, name);
        return Json.parse(new String(Files.readAllBytes(path), StandardCharsets.UTF_8));
    }

    static JSONObject object(JSONArray array, int index) {
        try {
            return array.getJSONObject(index);
        } catch (JSONException error) {
            throw new AssertionError(error);
        }
    }

    /** Equal as JSON values: numbers by value (1 == 1.0), objects by keys, arrays in order. */
    static boolean same(Object a, Object b) {
        if (a instanceof Number && b instanceof Number) {
            return ((Number) a).doubleValue() == ((Number) b).doubleValue();
        }
        if (a instanceof JSONObject && b instanceof JSONObject) {
            JSONObject x = (JSONObject) a;
            JSONObject y = (JSONObject) b;
            if (x.length() != y.length()) {
                return false;
            }
            for (Iterator<?> keys = x.keys(); keys.hasNext(); ) {
                String key = (String) keys.next();
                if (!y.has(key) || !same(x.opt(key), y.opt(key))) {
                    return false;
                }
            }
            return true;
        }
        if (a instanceof JSONArray && b instanceof JSONArray) {
            JSONArray x = (JSONArray) a;
            JSONArray y = (JSONArray) b;
            if (x.length() != y.length()) {
                return false;
            }
            for (int i = 0; i < x.length(); i++) {
                if (!same(x.opt(i), y.opt(i))) {
                    return false;
                }
            }
            return true;
        }
        return a == null ? b == null : a.equals(b);
    }

    static Double optDouble(JSONObject data, String name) {
        return data.has(name) && !data.isNull(name) ? data.optDouble(name) : null;
    }
}
