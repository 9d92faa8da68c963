/*
 * JUnit 4 tests of the app-side Selector: the shared decision table (selector_cases.json, which the Python selector
 * must pass too: its cases for choose, its size_cases for chooseSize), plus the version arithmetic, the pad values'
 * text and a graph the manifest lacks.
 * Run: javac -cp <org.json jar>:<junit4 jar> ... then org.junit.runner.JUnitCore qnntasks.ship.SelectorTest, with the
 * system property selector.cases pointing at the JSON (tests/test_ship_select.py does this with Debian's jars).
 */
package qnntasks.ship;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.json.JSONArray;
import org.json.JSONObject;
import org.junit.Test;

public class SelectorTest {

    private static JSONObject table() throws Exception {
        String path = System.getProperty("selector.cases", "src/test/resources/selector_cases.json");
        return new JSONObject(new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8));
    }

    private static String optText(JSONObject o, String key) {
        return o.isNull(key) ? null : o.optString(key);
    }

    /** The table's cases under key (choose's "cases", chooseSize's "size_cases"): at least 10 of them. */
    private static List<JSONObject> cases(JSONObject table, String key) throws Exception {
        JSONArray array = table.getJSONArray(key);
        assertTrue("the table has " + key, array.length() >= 10);
        List<JSONObject> out = new ArrayList<>();
        for (int i = 0; i < array.length(); i++) {
            out.add(array.getJSONObject(i));
        }
        return out;
    }

    private static JSONObject manifestOf(JSONObject table, JSONObject c) throws Exception {
        return table.getJSONObject("manifests").getJSONObject(c.getString("manifest"));
    }

    @Test
    public void everyCaseOfTheSharedTable() throws Exception {
        JSONObject table = table();
        for (JSONObject c : cases(table, "cases")) {
            String name = c.getString("name");
            JSONObject errors = c.getJSONObject("load_errors");
            List<String> loaded = new ArrayList<>();
            Selector.Decision d = Selector.choose(manifestOf(table, c), c.getString("graph"), optText(c, "soc"),
                    optText(c, "runtime_qnn"), binary -> {
                        String path = binary.optString("path");
                        loaded.add(path);
                        return errors.has(path) ? errors.optString(path) : null;
                    });
            JSONObject e = c.getJSONObject("expect");
            assertEquals(name + ": target", e.getString("target"), d.target);
            assertEquals(name + ": precision", optText(e, "precision"), d.precision);
            assertEquals(name + ": path", optText(e, "path"), d.path);
            assertEquals(name + ": rule", e.getString("rule"), d.rule);
            assertEquals(name + ": reason", e.getString("reason"), d.reason);
            List<String> expectedLoads = new ArrayList<>();
            for (int j = 0; j < e.getJSONArray("loaded").length(); j++) {
                expectedLoads.add(e.getJSONArray("loaded").getString(j));
            }
            assertEquals(name + ": binaries the loader was asked for", expectedLoads, loaded);
        }
    }

    @Test
    public void everySizeCaseOfTheSharedTable() throws Exception {
        JSONObject table = table();
        for (JSONObject c : cases(table, "size_cases")) {
            String name = c.getString("name");
            if (c.has("error")) {
                try {
                    Selector.chooseSize(manifestOf(table, c), c.getString("graph"), c.getInt("length"));
                    fail(name + ": no exception");
                } catch (IllegalArgumentException expected) {
                    String message = expected.getMessage();
                    assertTrue(name + ": " + message, message.contains(c.getString("error")));
                    assertTrue(name + ": one line", message.startsWith("manifest of ") && !message.contains("\n"));
                }
                continue;
            }
            Selector.SizeChoice d = Selector.chooseSize(manifestOf(table, c), c.getString("graph"), c.getInt("length"));
            JSONObject e = c.getJSONObject("expect");
            assertEquals(name + ": graph", optText(e, "graph"), d.graph);
            assertEquals(name + ": size", e.isNull("size") ? null : Integer.valueOf(e.getInt("size")), d.size);
            assertEquals(name + ": pad", e.getInt("pad"), d.pad);
            assertEquals(name + ": truncate", e.getInt("truncate"), d.truncate);
            assertEquals(name + ": rule", e.getString("rule"), d.rule);
            assertEquals(name + ": reason", e.getString("reason"), d.reason);
            Map<String, Double> values = new LinkedHashMap<>();
            JSONObject expected = e.getJSONObject("pad_values");
            for (Iterator<String> keys = expected.keys(); keys.hasNext();) {
                String key = keys.next();
                values.put(key, expected.getDouble(key));
            }
            assertEquals(name + ": pad values", values, d.padValues);
            assertEquals(name + ": pad values in the manifest's order", new ArrayList<>(values.keySet()),
                    new ArrayList<>(d.padValues.keySet()));
        }
    }

    @Test
    public void padValuesReadTheSameInBothLanguages() {
        String[] expected = {"0", "0", "-10000", "0.25", "0.00001", "100000000000000000000", "3"};
        double[] values = {0.0, -0.0, -10000.0, 0.25, 1e-05, 1e20, 3};
        for (int i = 0; i < values.length; i++) {
            assertEquals(expected[i], Selector.number(values[i]));
        }
    }

    @Test
    public void versionsCompareNumerically() {
        assertTrue(Selector.older(Selector.version("2.9"), Selector.version("2.10")));
        assertFalse(Selector.older(Selector.version("2.10"), Selector.version("2.9.9")));
        assertFalse(Selector.older(Selector.version("2.41"), Selector.version("2.41.0")));
        assertEquals(3, Selector.version("v2.41.0.251023").length - 1);
        assertNull(Selector.version("unknown"));
        assertNull(Selector.version(null));
    }

    @Test
    public void aNewerManifestSchemaIsAnError() throws Exception {
        JSONObject manifest = table().getJSONObject("manifests").getJSONObject("main");
        manifest.put("schema_version", 2);
        try {
            Selector.choose(manifest, "minilm", "SM8650", "2.41.0", binary -> null);
            fail("no exception");
        } catch (IllegalArgumentException expected) {
            assertTrue(expected.getMessage().contains("schema_version 2, this selector reads 1"));
        }
    }

    @Test
    public void aGraphTheManifestLacksIsAnError() throws Exception {
        JSONObject manifest = table().getJSONObject("manifests").getJSONObject("main");
        try {
            Selector.choose(manifest, "nope", "SM8650", "2.41.0", binary -> null);
            fail("no exception");
        } catch (IllegalArgumentException expected) {
            assertTrue(expected.getMessage().contains("no graph 'nope'"));
        }
    }
}
