/*
 * JUnit 4 tests of the app-side Selector: the shared decision table (selector_cases.json, which the Python selector
 * must pass too: its cases for choose, its size_cases for chooseSize), plus the version arithmetic, the pad values'
 * text and a graph the manifest lacks; and the bad manifests and left-out builds of manifest_cases.json (the system
 * property selector.manifest_cases, beside selector_cases.json by default), which select.py must pass too.
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

    private static JSONObject manifestTable() throws Exception {
        String path = System.getProperty("selector.manifest_cases", "src/test/resources/manifest_cases.json");
        return new JSONObject(new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8));
    }

    /** A deep copy that keeps every value's type (toString and back would turn 0.0 into 0). */
    private static Object copy(Object value) throws Exception {
        if (value instanceof JSONObject) {
            JSONObject from = (JSONObject) value;
            JSONObject out = new JSONObject();
            for (Iterator<String> keys = from.keys(); keys.hasNext();) {
                String key = keys.next();
                out.put(key, copy(from.get(key)));
            }
            return out;
        }
        if (value instanceof JSONArray) {
            JSONArray from = (JSONArray) value;
            JSONArray out = new JSONArray();
            for (int i = 0; i < from.length(); i++) {
                out.put(copy(from.get(i)));
            }
            return out;
        }
        return value;
    }

    /** The holder of a path's last step (keys and list indexes), walked from root. */
    private static Object holder(Object root, JSONArray path) throws Exception {
        Object at = root;
        for (int i = 0; i < path.length() - 1; i++) {
            Object step = path.get(i);
            at = step instanceof String ? ((JSONObject) at).get((String) step) : ((JSONArray) at).get((Integer) step);
        }
        return at;
    }

    /** A manifest_cases.json case's manifest: its base (selector_cases.json) with set and delete applied. */
    private static JSONObject mutated(JSONObject table, JSONObject c) throws Exception {
        JSONObject manifest = (JSONObject) copy(table.getJSONObject("manifests").getJSONObject(c.getString("base")));
        JSONArray set = c.optJSONArray("set");
        for (int i = 0; set != null && i < set.length(); i++) {
            JSONArray path = set.getJSONArray(i).getJSONArray(0);
            Object value = copy(set.getJSONArray(i).get(1));
            Object last = path.get(path.length() - 1);
            Object at = holder(manifest, path);
            if (last instanceof String) {
                ((JSONObject) at).put((String) last, value);
            } else {
                ((JSONArray) at).put((Integer) last, value);
            }
        }
        JSONArray delete = c.optJSONArray("delete");
        for (int i = 0; delete != null && i < delete.length(); i++) {
            JSONArray path = delete.getJSONArray(i);
            Object last = path.get(path.length() - 1);
            Object at = holder(manifest, path);
            if (last instanceof String) {
                ((JSONObject) at).remove((String) last);
            } else {
                ((JSONArray) at).remove((Integer) last);
            }
        }
        return manifest;
    }

    private static void assertDecision(String name, JSONObject e, Selector.Decision d, List<String> loaded)
            throws Exception {
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

    /** choose on a manifest_cases.json case: its text, or its mutated base; the loads it asked for in loaded. */
    private static Selector.Decision chooseCase(JSONObject table, JSONObject c, List<String> loaded)
            throws Exception {
        JSONObject errors = c.getJSONObject("load_errors");
        Selector.Loader load = binary -> {
            String path = binary.optString("path");
            loaded.add(path);
            return errors.has(path) ? errors.optString(path) : null;
        };
        if (c.has("text")) {
            return Selector.choose(c.getString("text"), c.getString("graph"), optText(c, "soc"),
                    optText(c, "runtime_qnn"), load);
        }
        return Selector.choose(mutated(table, c), c.getString("graph"), optText(c, "soc"), optText(c, "runtime_qnn"),
                load);
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
            assertDecision(name, c.getJSONObject("expect"), d, loaded);
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
    public void everyBadManifestOfTheSharedTable() throws Exception {
        JSONObject table = table();
        for (JSONObject c : cases(manifestTable(), "bad")) {
            String name = c.getString("name");
            List<String> loaded = new ArrayList<>();
            assertDecision(name, c.getJSONObject("expect"), chooseCase(table, c, loaded), loaded);
            Selector.SizeChoice size = c.has("text") ? Selector.chooseSize(c.getString("text"), c.getString("graph"), 5)
                    : Selector.chooseSize(mutated(table, c), c.getString("graph"), 5);
            assertNull(name + ": no size graph", size.graph);
            assertEquals(name + ": size rule", Selector.BAD_MANIFEST, size.rule);
            assertEquals(name + ": size reason", c.getString("problem"), size.reason);
            if (!c.has("text")) {
                assertEquals(name + ": validate", c.getString("problem"), Selector.validate(mutated(table, c)));
            }
        }
    }

    @Test
    public void everyLeftOutBuildOfTheSharedTable() throws Exception {
        JSONObject table = table();
        JSONArray left = manifestTable().getJSONArray("left_out");
        assertTrue("the table has left_out cases", left.length() >= 5);
        for (int i = 0; i < left.length(); i++) {
            JSONObject c = left.getJSONObject(i);
            List<String> loaded = new ArrayList<>();
            assertDecision(c.getString("name"), c.getJSONObject("expect"), chooseCase(table, c, loaded), loaded);
        }
    }

    @Test
    public void aNanPadInAJsonObjectBuiltFromAMapIsNamed() throws Exception {
        // org.json's parser refuses NaN (a text with one is "not valid JSON"), a Map can still hold one
        JSONObject manifest = (JSONObject) copy(table().getJSONObject("manifests").getJSONObject("sized"));
        JSONObject entry = manifest.getJSONObject("selection").getJSONArray("sizes").getJSONObject(0);
        Map<String, Object> pad = new LinkedHashMap<>();
        pad.put("input_ids", Double.NaN);
        pad.put("attention_mask", 0.0);
        entry.put("pad", new JSONObject(pad));
        String expected = "manifest.json: selection.sizes[0].pad.input_ids: expected a finite number (fix: rebuild"
                + " the package with doit dist)";
        assertEquals(expected, Selector.validate(manifest));
        Selector.Decision d = Selector.choose(manifest, "minilm.seq16", "SM8650", "2.41.0", binary -> null);
        assertEquals("cpu/minilm.seq16.onnx", d.path);
        assertEquals(Selector.BAD_MANIFEST, d.rule);
        assertEquals(expected, Selector.chooseSize(manifest, "minilm", 5).reason);
    }

    @Test
    public void aTextReadsAsItsObjectDoes() throws Exception {
        JSONObject manifest = table().getJSONObject("manifests").getJSONObject("main");
        Selector.Decision fromText = Selector.choose(manifest.toString(), "minilm", "SM8650", "2.41.0", b -> null);
        Selector.Decision fromObject = Selector.choose(manifest, "minilm", "SM8650", "2.41.0", b -> null);
        assertEquals(fromObject.reason, fromText.reason);
        assertEquals("SM8650/minilm.fp16.bin", fromText.path);
        assertNull(Selector.parse("{\"a\": 1} {\"b\": 2}"));
        assertNull(Selector.parse("{\"a\": NaN}"));
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

    /**
     * The generated device table (device_cases.json, tests/device_table.py; the system property
     * selector.device_cases): chip x runtime QNN x precision order x graph and input length, each load answered as
     * the load oracle predicts. The same size, decision and reason as the Python selector and the oracle, per case.
     */
    @Test
    public void everyCaseOfTheGeneratedDeviceTable() throws Exception {
        String path = System.getProperty("selector.device_cases", "src/test/resources/device_cases.json");
        JSONObject table = new JSONObject(new String(Files.readAllBytes(Paths.get(path)), StandardCharsets.UTF_8));
        JSONArray array = table.getJSONArray("cases");
        assertTrue("at least 200 device cases", array.length() >= 200);
        for (int i = 0; i < array.length(); i++) {
            JSONObject c = array.getJSONObject(i);
            String name = c.getString("name");
            JSONObject manifest = manifestOf(table, c);
            String graph = c.getString("graph");
            if (!c.isNull("length")) {
                Selector.SizeChoice size = Selector.chooseSize(manifest, graph, c.getInt("length"));
                JSONObject e = c.getJSONObject("size");
                assertEquals(name + ": size graph", optText(e, "graph"), size.graph);
                assertEquals(name + ": size rule", e.getString("rule"), size.rule);
                assertEquals(name + ": size reason", e.getString("reason"), size.reason);
                graph = size.graph;
            }
            if (graph == null) {
                assertTrue(name + ": no decision expected", c.isNull("expect"));
                continue;
            }
            JSONObject errors = c.getJSONObject("load_errors");
            List<String> loaded = new ArrayList<>();
            Integer free = c.isNull("free_memory_mb") ? null : c.getInt("free_memory_mb");
            Selector.Decision d = Selector.choose(manifest, graph, optText(c, "soc"), optText(c, "runtime_qnn"), free,
                    binary -> {
                        String at = binary.optString("path");
                        loaded.add(at);
                        return errors.has(at) ? errors.optString(at) : null;
                    });
            assertDecision(name, c.getJSONObject("expect"), d, loaded);
        }
    }
}
