/*
 * Which build of a qnn-npu-compile package runs on this device: the reference for apps (Java, usable from Kotlin).
 *
 * The same rules as the tool's own qnn_tasks/ship/select.py, word for word (the decision table in
 * src/test/resources/selector_cases.json is run through both and must give the same target, path, precision,
 * rule and reason string):
 *   1. candidates: the graph's binaries whose "socs" holds the device's ro.soc.model exactly (a binary of the same
 *      Hexagon arch is not a match unless the manifest lists the chip); none: the CPU, "no build for <chip>";
 *   2. ordered by the manifest's selection.precision_order (fp16 before w8a16 unless the model says otherwise);
 *   3. a binary whose min_runtime_qnn is newer than the runtime libraries' QNN version is refused (it would fail to
 *      load: QNN error 5000/5005); an unknown runtime version refuses them all;
 *   4. the first candidate left is loaded through the caller's Loader; a failed load: the CPU, with its error.
 * chooseSize(manifest, graph, length) comes first for a graph with sizes (model.yaml dims:): the smallest size the
 * package ships a graph for that holds the input's length along the dim ("smallest that fits"), padded with the
 * manifest's pad values; longer than every size: truncated to the largest, or none (longer: skip). Its graph is the
 * one to pass to choose. Where the manifest's rule is "exact length only" (padding not vouched for: the cross-size
 * check did not pass) a shorter input takes only a size of exactly its length, else none. The same table holds its
 * cases (size_cases).
 * No Android dependency in the logic: the caller passes android.os.Build.SOC_MODEL (API 31+), the QNN version of the
 * runtime libraries it ships, and a Loader that creates the QNN context (or the ONNX Runtime session) from the file.
 * JSON: org.json, which Android itself provides (the tests here use Debian's libandroid-json-java, the same code).
 */
package qnntasks.ship;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.json.JSONArray;
import org.json.JSONException;
import org.json.JSONObject;

public final class Selector {
    public static final String CODE = "5000/5005";
    public static final int SCHEMA_VERSION = 1;
    public static final String[] DEFAULT_PRECISION_ORDER = {"fp16", "w8a16"};

    public static final String NPU = "npu";
    public static final String NO_BUILD = "no-build";
    public static final String RUNTIME_UNKNOWN = "runtime-unknown";
    public static final String RUNTIME_OLDER = "runtime-older";
    public static final String LOAD_FAILED = "load-failed";

    public static final String RULE_SIZES = "smallest that fits";
    public static final String RULE_EXACT = "exact length only";
    public static final String FITS = "fits";
    public static final String TRUNCATE = "truncate";
    public static final String TOO_LONG = "too-long";
    public static final String NONE_SHIPPED = "none-shipped";
    public static final String NO_SIZES = "no-sizes";
    public static final String NOT_EXACT = "not-exact";

    private static final Pattern VERSION = Pattern.compile("^v?([0-9]+(?:\\.[0-9]+)*)");

    private Selector() {
    }

    /** Creates the context from the binary; returns null when it loaded, else the error text. */
    public interface Loader {
        String load(JSONObject binary);
    }

    /** What runs: target "npu" or "cpu", the file (relative to the package root), the precision, why, which rule. */
    public static final class Decision {
        public final String target;
        public final String path;
        public final String precision;
        public final String reason;
        public final String rule;

        Decision(String target, String path, String precision, String reason, String rule) {
            this.target = target;
            this.path = path;
            this.precision = precision;
            this.reason = reason;
            this.rule = rule;
        }

        public boolean onNpu() {
            return NPU.equals(target);
        }

        @Override
        public String toString() {
            return target + " " + path + " (" + reason + ")";
        }
    }

    /**
     * Which size of a graph takes the input: the graph to run (null: none does), its size (null without sizes), how
     * many positions to pad (each input with its pad value) or to cut off the end, why, which rule.
     */
    public static final class SizeChoice {
        public final String graph;
        public final Integer size;
        public final int pad;
        public final int truncate;
        public final String reason;
        public final String rule;
        public final Map<String, Double> padValues;

        SizeChoice(String graph, Integer size, int pad, int truncate, String reason, String rule,
                   Map<String, Double> padValues) {
            this.graph = graph;
            this.size = size;
            this.pad = pad;
            this.truncate = truncate;
            this.reason = reason;
            this.rule = rule;
            this.padValues = Collections.unmodifiableMap(padValues);
        }

        @Override
        public String toString() {
            return graph + " (" + reason + ")";
        }
    }

    /** Parses a manifest.json text (org.json). */
    public static JSONObject manifest(String json) throws JSONException {
        return new JSONObject(json);
    }

    /** Numeric parts of "2.41.0", "v2.41.0.251023" or "2.10" (2.10 > 2.9); null if it is not a version. */
    public static int[] version(String text) {
        if (text == null) {
            return null;
        }
        Matcher m = VERSION.matcher(text.trim());
        if (!m.find()) {
            return null;
        }
        String[] parts = m.group(1).split("\\.");
        int[] out = new int[parts.length];
        for (int i = 0; i < parts.length; i++) {
            out[i] = Integer.parseInt(parts[i]);
        }
        return out;
    }

    /** a < b, missing parts read as 0 (2.41 == 2.41.0). */
    public static boolean older(int[] a, int[] b) {
        int width = Math.max(a.length, b.length);
        for (int i = 0; i < width; i++) {
            int x = i < a.length ? a[i] : 0;
            int y = i < b.length ? b[i] : 0;
            if (x != y) {
                return x < y;
            }
        }
        return false;
    }

    /** A pad value for a reason string: 0, -10000, 0.5, 0.00001 (the Python selector writes the same). */
    public static String number(double value) {
        if (value == Math.rint(value) && Math.abs(value) < 1e15) {
            return String.valueOf((long) value);
        }
        return BigDecimal.valueOf(value).stripTrailingZeros().toPlainString();
    }

    /**
     * Which size of graph (a declared graph with sizes, e.g. "minilm") takes an input holding length positions along
     * its dim: the smallest size whose graph the package ships that holds it, padded; longer than every shipped size:
     * the largest, truncated (longer: truncate), or none (longer: skip). A graph without sizes as is.
     */
    public static SizeChoice chooseSize(JSONObject manifest, String graph, int length) {
        checkSchema(manifest);
        JSONObject graphs = manifest.optJSONObject("graphs");
        graphs = graphs == null ? new JSONObject() : graphs;
        JSONObject selection = manifest.optJSONObject("selection");
        JSONObject entry = sizesOf(selection, graph);
        if (entry == null && !graphs.has(graph)) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": no graph '" + graph + "'");
        }
        JSONObject own = graphs.optJSONObject(graph);
        JSONObject of = own == null ? null : own.optJSONObject("size");
        if (entry == null && of != null && sizesOf(selection, of.optString("of", null)) != null) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": " + graph + " is size "
                    + text(of, "size") + " of " + of.optString("of") + ": the size is chosen from the declared graph"
                    + " (fix: pass '" + of.optString("of") + "', or call choose on " + graph + " directly)");
        }
        if (length < 1) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": length " + length
                    + " for " + graph + ": an input holds at least 1 position (fix: pass the input's content length"
                    + " along the dim, e.g. its token count)");
        }
        Map<String, Double> none = new LinkedHashMap<>();
        if (entry == null) {
            return new SizeChoice(graph, null, 0, 0, graph + " has no sizes: it runs at its one shape", NO_SIZES, none);
        }
        List<Integer> sizes = new ArrayList<>();
        JSONArray declared = entry.optJSONArray("sizes");
        for (int i = 0; declared != null && i < declared.length(); i++) {
            sizes.add(declared.optInt(i));
        }
        Collections.sort(sizes);
        JSONObject bySize = entry.optJSONObject("graphs");
        bySize = bySize == null ? new JSONObject() : bySize;
        List<String> shipped = new ArrayList<>();
        List<String> missing = new ArrayList<>();
        List<Integer> shippedSizes = new ArrayList<>();
        for (Integer s : sizes) {
            String name = bySize.optString(String.valueOf(s), null);
            if (name != null && graphs.has(name)) {
                shipped.add(String.valueOf(s));
                shippedSizes.add(s);
            } else {
                missing.add(String.valueOf(s));
            }
        }
        String note = "sizes " + String.join(", ", shipped)
                + (missing.isEmpty() ? "" : "; not in the package: " + String.join(", ", missing));
        String what = length + " along " + text(entry, "dim");
        if (shippedSizes.isEmpty()) {
            List<String> all = new ArrayList<>();
            for (Integer s : sizes) {
                all.add(String.valueOf(s));
            }
            return new SizeChoice(null, null, 0, 0, "no size of " + graph + " is in the package (declared "
                    + String.join(", ", all) + "): " + what + " runs nowhere", NONE_SHIPPED, none);
        }
        Map<String, Double> padValues = new LinkedHashMap<>();
        List<String> values = new ArrayList<>();
        JSONObject pads = entry.optJSONObject("pad");
        Iterator<String> keys = pads == null ? Collections.<String>emptyIterator() : pads.keys();
        while (keys.hasNext()) {
            String name = keys.next();
            padValues.put(name, pads.optDouble(name));
            values.add(name + " " + number(pads.optDouble(name)));
        }
        // padding not vouched for (its cross-size check did not pass): a shorter input takes only its exact length
        if (!RULE_SIZES.equals(entry.optString("rule", null)) && length <= shippedSizes.get(shippedSizes.size() - 1)) {
            if (shippedSizes.contains(length)) {
                String run = bySize.optString(String.valueOf(length));
                return new SizeChoice(run, length, 0, 0, RULE_EXACT + ": " + what + " -> " + run + " (" + note
                        + "; no padding)", FITS, padValues);
            }
            return new SizeChoice(null, null, 0, 0, RULE_EXACT + ": " + what + " is no size's length (" + note + "): "
                    + text(entry, "why") + ": the app must refuse the input", NOT_EXACT, none);
        }
        for (Integer fits : shippedSizes) {
            if (fits >= length) {
                String run = bySize.optString(String.valueOf(fits));
                String padding = fits > length ? "pad " + (fits - length)
                        + (values.isEmpty() ? "" : " with " + String.join(", ", values)) : "no padding";
                return new SizeChoice(run, fits, fits - length, 0, RULE_SIZES + ": " + what + " -> " + run + " ("
                        + note + "; " + padding + ")", FITS, padValues);
            }
        }
        int largest = shippedSizes.get(shippedSizes.size() - 1);
        if ("truncate".equals(entry.optString("longer", null))) {
            String run = bySize.optString(String.valueOf(largest));
            return new SizeChoice(run, largest, 0, length - largest, "longer than every size: " + what + " -> " + run
                    + ", truncated by " + (length - largest) + " (" + note + "; longer: truncate)", TRUNCATE,
                    padValues);
        }
        return new SizeChoice(null, null, 0, 0, "longer than every size: " + what + ", the largest is " + largest
                + " (" + note + "; longer: skip): the app must refuse or split the input", TOO_LONG, none);
    }

    /** The first selection.sizes entry of a declared graph (as the Python selector reads it), or null. */
    private static JSONObject sizesOf(JSONObject selection, String graph) {
        for (JSONObject s : objects(selection == null ? null : selection.optJSONArray("sizes"))) {
            if (graph != null && graph.equals(s.optString("graph", null))) {
                return s;
            }
        }
        return null;
    }

    private static void checkSchema(JSONObject manifest) {
        if (manifest.has("schema_version") && manifest.optInt("schema_version", -1) != SCHEMA_VERSION) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": schema_version "
                    + manifest.opt("schema_version") + ", this selector reads " + SCHEMA_VERSION
                    + " (fix: use the selector of the qnn-npu-compile that wrote it)");
        }
    }

    /** The decision for graph on this device; for a graph with sizes, pass the graph chooseSize returned. */
    public static Decision choose(JSONObject manifest, String graph, String soc, String runtimeQnn, Loader load) {
        checkSchema(manifest);
        JSONObject graphs = manifest.optJSONObject("graphs");
        if (graphs == null || !graphs.has(graph)) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": no graph '" + graph + "'");
        }
        JSONObject entry = graphs.optJSONObject(graph);
        JSONObject fb = entry.optJSONObject("fallback");
        String fallback = fb == null || fb.isNull("path") ? null : fb.optString("path");

        List<JSONObject> binaries = objects(entry.optJSONArray("binaries"));
        List<JSONObject> found = new ArrayList<>();
        TreeSet<String> built = new TreeSet<>();
        for (JSONObject b : binaries) {
            List<String> socs = strings(b.optJSONArray("socs"));
            built.addAll(socs);
            if (soc != null && !soc.isEmpty() && socs.contains(soc)) {
                found.add(b);
            }
        }
        if (found.isEmpty()) {
            String chip = soc == null || soc.isEmpty() ? "an empty ro.soc.model" : soc;
            return cpu(NO_BUILD, "no build for " + chip + " (builds for: "
                    + (built.isEmpty() ? "none" : String.join(", ", built)) + ")", fallback);
        }
        List<JSONObject> ordered = inOrder(found, precisionOrder(manifest));
        int[] runtime = version(runtimeQnn);
        if (runtime == null) {
            List<String> labels = new ArrayList<>();
            for (JSONObject b : ordered) {
                labels.add(label(b));
            }
            return cpu(RUNTIME_UNKNOWN, "runtime libraries' QNN version unknown ("
                    + (runtimeQnn == null || runtimeQnn.isEmpty() ? "libraries absent" : runtimeQnn)
                    + "): a binary newer than the runtime fails to load (QNN error " + CODE
                    + "), so none of " + String.join(", ", labels) + " is tried", fallback);
        }
        List<String> refused = new ArrayList<>();
        List<JSONObject> left = new ArrayList<>();
        for (JSONObject b : ordered) {
            String why = runtimeRefusal(b, runtime);
            if (why == null) {
                left.add(b);
            } else {
                refused.add(why);
            }
        }
        String skipped = String.join("; ", refused);
        if (left.isEmpty()) {
            return cpu(RUNTIME_OLDER, "runtime QNN " + runtimeQnn + " is too old: " + skipped
                    + " (it would fail to load: QNN error " + CODE + ")", fallback);
        }
        JSONObject pick = left.get(0);
        String error = load.load(pick);
        if (error != null) {
            return cpu(LOAD_FAILED, label(pick) + " did not load: " + error, fallback);
        }
        String how = soc.equals(pick.optString("soc", null)) ? "built for" : "built for " + text(pick, "soc")
                + ", verified on";
        String reason = label(pick) + ": " + how + " " + soc + ", runtime QNN " + runtimeQnn + " >= minimum "
                + text(pick, "min_runtime_qnn") + " (from " + text(pick, "min_runtime_from") + "), context loaded";
        if (!refused.isEmpty()) {
            reason += "; skipped: " + skipped + " (QNN error " + CODE + ")";
        }
        return new Decision("npu", pick.isNull("path") ? null : pick.optString("path"),
                pick.isNull("precision") ? null : pick.optString("precision"), reason, NPU);
    }

    /** Rule 3 for one binary: why this runtime cannot load it, or null. */
    public static String runtimeRefusal(JSONObject binary, int[] runtime) {
        int[] needed = binary.isNull("min_runtime_qnn") ? null : version(binary.optString("min_runtime_qnn"));
        if (needed == null) {
            return label(binary) + " records no min_runtime_qnn";
        }
        if (older(runtime, needed)) {
            return label(binary) + " needs QNN " + text(binary, "min_runtime_qnn") + " or newer (minimum from "
                    + text(binary, "min_runtime_from") + ")";
        }
        return null;
    }

    private static Decision cpu(String rule, String why, String fallback) {
        String where = fallback != null ? "the CPU runs " + fallback : "no CPU fallback in the manifest";
        return new Decision("cpu", fallback, null, why + "; " + where, rule);
    }

    private static List<JSONObject> inOrder(List<JSONObject> found, List<String> order) {
        Map<String, Integer> rank = new HashMap<>();
        for (int i = 0; i < order.size(); i++) {
            rank.putIfAbsent(order.get(i), i);
        }
        List<JSONObject> sorted = new ArrayList<>(found);
        // List.sort is stable: a precision the order does not name comes after, in manifest order
        sorted.sort((a, b) -> Integer.compare(rank.getOrDefault(a.optString("precision", null), order.size()),
                rank.getOrDefault(b.optString("precision", null), order.size())));
        return sorted;
    }

    private static List<String> precisionOrder(JSONObject manifest) {
        JSONObject selection = manifest.optJSONObject("selection");
        List<String> order = selection == null ? new ArrayList<>() : strings(selection.optJSONArray("precision_order"));
        if (order.isEmpty()) {
            order = Arrays.asList(DEFAULT_PRECISION_ORDER);
        }
        return order;
    }

    private static String label(JSONObject binary) {
        return text(binary, "precision") + " " + text(binary, "path");
    }

    private static String text(JSONObject o, String key) {
        return o.isNull(key) ? "?" : o.optString(key);
    }

    private static List<JSONObject> objects(JSONArray array) {
        List<JSONObject> out = new ArrayList<>();
        for (int i = 0; array != null && i < array.length(); i++) {
            JSONObject o = array.optJSONObject(i);
            if (o != null) {
                out.add(o);
            }
        }
        return out;
    }

    private static List<String> strings(JSONArray array) {
        List<String> out = new ArrayList<>();
        for (int i = 0; array != null && i < array.length(); i++) {
            if (!array.isNull(i)) {
                out.add(array.optString(i));
            }
        }
        return out;
    }
}
