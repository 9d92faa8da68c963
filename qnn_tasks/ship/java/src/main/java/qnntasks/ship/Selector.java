/*
 * Which build of a qnn-npu-compile package runs on this device: the reference for apps (Java, usable from Kotlin).
 *
 * The same rules as the tool's own qnn_tasks/qnn/select.py, word for word (the decision table in
 * src/test/resources/selector_cases.json is run through both and must give the same target, path, precision,
 * rule and reason string):
 *   1. candidates: the graph's binaries whose "socs" holds the device's ro.soc.model exactly (a binary of the same
 *      Hexagon arch is not a match unless the manifest lists the chip); none: the CPU, "no build for <chip>";
 *   2. ordered by the manifest's selection.precision_order (fp16 before w8a16 unless the model says otherwise);
 *   3. a binary whose min_runtime_qnn is newer than the runtime libraries' QNN version is refused (it would fail to
 *      load: QNN error 5000/5005); an unknown runtime version refuses them all;
 *   4. where the app declares the memory it can give (freeMemoryMb), a binary whose manifest memory.resident_bytes is
 *      more is skipped (its load would fail to allocate: QNN error 1002); none left: the CPU, rule out-of-memory;
 *   5. the first candidate left is loaded through the caller's Loader; a failed load: the CPU, with its error.
 * Before any rule the manifest is checked (validate: the fields these rules read, with the schema's shapes): a
 * manifest that is no JSON, or has a field of the wrong shape, gives the CPU (rule bad-manifest) with the field in
 * the reason, the same line select.py writes (src/test/resources/manifest_cases.json holds the cases). A chip whose
 * build dist left out as failed or stale (the manifest's "omitted") is told so (rule unverified), not "no build".
 * Pass manifest.json's text (choose(String, ...), chooseSize(String, ...)) so that a truncated file is one too.
 * chooseSize(manifest, graph, length) comes first for a graph with sizes (model.yaml dims:): the smallest size the
 * package ships a graph for that holds the input's length along the dim ("smallest that fits"), padded with the
 * manifest's pad values; longer than every size: truncated to the largest, or none (longer: skip). Its graph is the
 * one to pass to choose. Where the manifest's rule is "exact length only" (padding not vouched for: the cross-size
 * check did not pass) a shorter input takes only a size of exactly its length, else none. The same table holds its
 * cases (size_cases). chain(manifest, graph) lists the graphs to choose for a split graph (model.yaml split:): its
 * parts, in order.
 * No Android dependency in the logic: the caller passes android.os.Build.SOC_MODEL (API 31+), the QNN version of the
 * runtime libraries it ships, and a Loader that creates the QNN context (or the ONNX Runtime session) from the file.
 * JSON: org.json, which Android itself provides (the tests here use Debian's libandroid-json-java, the same code).
 */
package qnntasks.ship;

import java.math.BigDecimal;
import java.math.BigInteger;
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
import org.json.JSONTokener;

public final class Selector {
    public static final String CODE = "5000/5005";
    public static final String MEMORY_CODE = "1002";  // QNN_COMMON_ERROR_MEM_ALLOC: a load that cannot allocate
    static final long MIB = 1L << 20;
    public static final int SCHEMA_VERSION = 1;
    public static final String[] DEFAULT_PRECISION_ORDER = {"fp16", "w8a16"};

    public static final String NPU = "npu";
    public static final String NO_BUILD = "no-build";
    public static final String RUNTIME_UNKNOWN = "runtime-unknown";
    public static final String RUNTIME_OLDER = "runtime-older";
    public static final String LOAD_FAILED = "load-failed";
    public static final String OUT_OF_MEMORY = "out-of-memory";
    public static final String UNVERIFIED = "unverified";
    public static final String BAD_MANIFEST = "bad-manifest";
    public static final String FIX = "(fix: rebuild the package with doit dist)";
    public static final String NOT_JSON = "manifest.json: not valid JSON: the file is truncated or was edited " + FIX;
    /** A size along a dim: an int (chooseSize takes an int length). */
    public static final long MAX_SIZE = Integer.MAX_VALUE;

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
        String problem = problem(manifest);
        if (problem != null) {
            return new SizeChoice(null, null, 0, 0, problem, BAD_MANIFEST, new LinkedHashMap<String, Double>());
        }
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

    /** chooseSize on manifest.json's text: a text that is no JSON object gives no graph (rule bad-manifest). */
    public static SizeChoice chooseSize(String manifestJson, String graph, int length) {
        Object manifest = parse(manifestJson);
        if (!(manifest instanceof JSONObject)) {
            String problem = manifest == null ? NOT_JSON : validate(manifest);
            return new SizeChoice(null, null, 0, 0, problem, BAD_MANIFEST, new LinkedHashMap<String, Double>());
        }
        return chooseSize((JSONObject) manifest, graph, length);
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
        Object found = manifest.opt("schema_version");
        if (kind(found).equals("integer") && ((Number) found).longValue() != SCHEMA_VERSION) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": schema_version "
                    + manifest.opt("schema_version") + ", this selector reads " + SCHEMA_VERSION
                    + " (fix: use the selector of the qnn-npu-compile that wrote it)");
        }
    }

    /**
     * The graphs that run graph, in order: a split graph's parts (model.yaml split:, the manifest's selection.splits),
     * each fed the previous part's outputs by name; any other graph alone. Choose each of them on the device.
     */
    public static List<String> chain(JSONObject manifest, String graph) {
        if (problem(manifest) != null) {
            return Collections.singletonList(graph);  // choose then gives the CPU with the field that is wrong
        }
        JSONObject split = splitOf(manifest.optJSONObject("selection"), graph);
        if (split != null) {
            return strings(split.optJSONArray("parts"));
        }
        JSONObject graphs = manifest.optJSONObject("graphs");
        if (graphs == null || !graphs.has(graph)) {
            throw new IllegalArgumentException("manifest of " + text(manifest, "model") + ": no graph '" + graph + "'");
        }
        return Collections.singletonList(graph);
    }

    /** The first selection.splits entry of graph (as the Python selector reads it), or null. */
    private static JSONObject splitOf(JSONObject selection, String graph) {
        for (JSONObject s : objects(selection == null ? null : selection.optJSONArray("splits"))) {
            if (graph != null && graph.equals(s.optString("graph", null))) {
                return s;
            }
        }
        return null;
    }

    private static String splitMessage(JSONObject manifest, String graph, JSONObject split) {
        return "manifest of " + text(manifest, "model") + ": '" + graph + "' is split into parts ("
                + String.join(", ", strings(split.optJSONArray("parts"))) + "): choose each part, run in order (fix: "
                + "chain(manifest, \"" + graph + "\") lists them)";
    }

    /** The decision for graph on this device; for a graph with sizes, pass the graph chooseSize returned. */
    public static Decision choose(JSONObject manifest, String graph, String soc, String runtimeQnn, Loader load) {
        return choose(manifest, graph, soc, runtimeQnn, null, load);
    }

    /**
     * The same, on a device that declares freeMemoryMb MiB it can give the model (e.g. from
     * ActivityManager.MemoryInfo.availMem; null: not declared): a binary needing more is skipped.
     */
    public static Decision choose(JSONObject manifest, String graph, String soc, String runtimeQnn,
            Integer freeMemoryMb, Loader load) {
        String problem = problem(manifest);
        if (problem != null) {
            return cpu(BAD_MANIFEST, problem, fallbackOf(manifest, graph));
        }
        JSONObject graphs = manifest.optJSONObject("graphs");
        if (graphs == null || graph == null || !graphs.has(graph)) {
            JSONObject split = splitOf(manifest.optJSONObject("selection"), graph);
            if (split != null) {
                throw new IllegalArgumentException(splitMessage(manifest, graph, split));
            }
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
        String failed = found.isEmpty() ? unverified(manifest, graph, soc) : null;
        if (failed != null) {
            return cpu(UNVERIFIED, failed, fallback);
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
        List<String> tooBig = new ArrayList<>();
        List<JSONObject> fits = new ArrayList<>();
        for (JSONObject b : left) {
            String why = memoryRefusal(b, freeMemoryMb);
            if (why == null) {
                fits.add(b);
            } else {
                tooBig.add(why);
            }
        }
        String tooBigText = String.join("; ", tooBig);
        if (fits.isEmpty()) {
            return cpu(OUT_OF_MEMORY, "not enough free memory: " + tooBigText + " (it would fail to load: QNN error "
                    + MEMORY_CODE + ")" + (refused.isEmpty() ? "" : "; skipped: " + skipped + " (QNN error " + CODE
                    + ")"), fallback);
        }
        JSONObject pick = fits.get(0);
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
        if (!tooBig.isEmpty()) {
            reason += "; skipped: " + tooBigText + " (QNN error " + MEMORY_CODE + ")";
        }
        return new Decision("npu", pick.isNull("path") ? null : pick.optString("path"),
                pick.isNull("precision") ? null : pick.optString("precision"), reason, NPU);
    }

    /** choose on manifest.json's text: a text that is no JSON object gives the CPU (rule bad-manifest). */
    public static Decision choose(String manifestJson, String graph, String soc, String runtimeQnn, Loader load) {
        Object manifest = parse(manifestJson);
        if (!(manifest instanceof JSONObject)) {
            return cpu(BAD_MANIFEST, manifest == null ? NOT_JSON : validate(manifest), null);
        }
        return choose((JSONObject) manifest, graph, soc, runtimeQnn, load);
    }

    /**
     * Why this chip has no build of graph when dist left it out as failed or stale (the manifest's omitted), e.g.
     * "the build for SM8650 failed verification (minilm-SM8650: failed: simverify: ...)"; null otherwise.
     */
    public static String unverified(JSONObject manifest, String graph, String soc) {
        List<String> details = new ArrayList<>();
        boolean failed = false;
        for (JSONObject o : objects(manifest.optJSONArray("omitted"))) {
            String reason = o.optString("reason");
            if (soc != null && !soc.isEmpty() && graph != null && graph.equals(o.opt("graph"))
                    && soc.equals(o.opt("soc")) && (reason.startsWith("failed:") || reason.startsWith("stale:"))) {
                failed |= reason.startsWith("failed:");
                details.add(o.optString("target") + ": " + reason);
            }
        }
        if (details.isEmpty()) {
            return null;
        }
        return "the build for " + soc + " " + (failed ? "failed verification" : "is stale (it changed since it was"
                + " verified)") + " (" + String.join("; ", details) + ")";
    }

    // --- the manifest's shape, checked before any rule (select.py's validate_manifest says the same, word for word)

    /** A field of the wrong shape: its one line (internal to validate). */
    private static final class Bad extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Bad(String message) {
            super(message);
        }
    }

    /**
     * manifest.json's text as strict JSON (nothing after the value; org.json refuses NaN and Infinity): the value
     * (a JSONObject, or whatever else the text holds), or null when it is no JSON.
     */
    public static Object parse(String json) {
        if (json == null) {
            return null;
        }
        try {
            JSONTokener tokens = new JSONTokener(json);
            Object value = tokens.nextValue();
            return tokens.nextClean() == 0 ? value : null;
        } catch (JSONException | RuntimeException | StackOverflowError e) {  // select.py: ValueError, RecursionError
            return null;
        }
    }

    /** The problem choose and chooseSize fall back on, or null; a newer schema_version is an error (this app's). */
    private static String problem(JSONObject manifest) {
        if (manifest != null) {
            checkSchema(manifest);
        }
        return validate(manifest);
    }

    /**
     * The first field the selector reads that has the wrong shape, as one line ("manifest.json: field: expected
     * ..., got ... (fix: ...)"); null when every one is as the schema (manifest.schema.json) says. Checked: the types,
     * a non-empty socs of chip names, binaries' path, precision, soc and min_runtime_qnn, the fallback's path,
     * selection.precision_order, sizes (whole sizes, finite pad values, longer) and splits (a graph's parts), omitted.
     */
    public static String validate(Object manifest) {
        try {
            checkManifest(manifest);
        } catch (Bad bad) {
            return "manifest.json: " + bad.getMessage() + " " + FIX;
        }
        return null;
    }

    private static void checkManifest(Object value) {
        JSONObject m = mapping(value, "(root)");
        if (m.has("schema_version")) {
            expect(m.opt("schema_version"), "schema_version", "an integer", true, "integer");
        }
        string(field(m, "model", "model"), "model");
        if (m.has("selection")) {
            JSONObject selection = mapping(m.opt("selection"), "selection");
            if (selection.has("precision_order")) {
                JSONArray order = list(selection.opt("precision_order"), "selection.precision_order", false);
                for (int i = 0; i < order.length(); i++) {
                    string(order.opt(i), "selection.precision_order[" + i + "]");
                }
            }
            if (selection.has("sizes")) {
                JSONArray sizes = list(selection.opt("sizes"), "selection.sizes", true);
                for (int i = 0; i < sizes.length(); i++) {
                    sizeEntry(sizes.opt(i), "selection.sizes[" + i + "]");
                }
            }
            if (selection.has("splits")) {
                JSONArray splits = list(selection.opt("splits"), "selection.splits", true);
                for (int i = 0; i < splits.length(); i++) {
                    String key = "selection.splits[" + i + "]";
                    JSONObject entry = mapping(splits.opt(i), key);
                    string(field(entry, "graph", key + ".graph"), key + ".graph");
                    JSONArray parts = list(field(entry, "parts", key + ".parts"), key + ".parts", false);
                    for (int j = 0; j < parts.length(); j++) {
                        string(parts.opt(j), key + ".parts[" + j + "]");
                    }
                }
            }
        }
        JSONObject graphs = mapping(field(m, "graphs", "graphs"), "graphs");
        expect(graphs, "graphs", "a non-empty mapping", graphs.length() > 0, "mapping");
        for (Iterator<String> names = graphs.keys(); names.hasNext();) {
            String name = names.next();
            graphEntry(graphs.opt(name), "graphs." + name);
        }
        if (m.has("omitted")) {
            JSONArray omitted = list(m.opt("omitted"), "omitted", true);
            for (int i = 0; i < omitted.length(); i++) {
                String key = "omitted[" + i + "]";
                JSONObject entry = mapping(omitted.opt(i), key);
                for (String name : new String[] {"target", "reason"}) {
                    string(field(entry, name, key + "." + name), key + "." + name);
                }
                for (String name : new String[] {"graph", "soc", "precision"}) {
                    if (entry.has(name)) {
                        string(entry.opt(name), key + "." + name);
                    }
                }
            }
        }
    }

    private static void sizeEntry(Object value, String key) {
        JSONObject entry = mapping(value, key);
        for (String name : new String[] {"graph", "dim"}) {
            string(field(entry, name, key + "." + name), key + "." + name);
        }
        JSONArray sizes = list(field(entry, "sizes", key + ".sizes"), key + ".sizes", false);
        for (int i = 0; i < sizes.length(); i++) {
            size(sizes.opt(i), key + ".sizes[" + i + "]");
        }
        JSONObject graphs = mapping(field(entry, "graphs", key + ".graphs"), key + ".graphs");
        for (Iterator<String> names = graphs.keys(); names.hasNext();) {
            String name = names.next();
            string(graphs.opt(name), key + ".graphs." + name);
        }
        JSONObject pad = mapping(field(entry, "pad", key + ".pad"), key + ".pad");
        for (Iterator<String> names = pad.keys(); names.hasNext();) {
            String name = names.next();
            Object v = pad.opt(name);
            expect(v, key + ".pad." + name, "a finite number", finite(v), "integer", "number");
        }
        Object longer = field(entry, "longer", key + ".longer");
        expect(longer, key + ".longer", "skip or truncate", "skip".equals(longer) || "truncate".equals(longer),
                "string");
    }

    private static void graphEntry(Object value, String key) {
        JSONObject entry = mapping(value, key);
        if (!entry.isNull("fallback")) {  // none: the decision says "no CPU fallback in the manifest"
            JSONObject fallback = mapping(entry.opt("fallback"), key + ".fallback");
            string(field(fallback, "path", key + ".fallback.path"), key + ".fallback.path");
        }
        JSONArray binaries = list(field(entry, "binaries", key + ".binaries"), key + ".binaries", true);
        for (int i = 0; i < binaries.length(); i++) {
            String at = key + ".binaries[" + i + "]";
            JSONObject binary = mapping(binaries.opt(i), at);
            JSONArray socs = list(field(binary, "socs", at + ".socs"), at + ".socs", false);
            for (int j = 0; j < socs.length(); j++) {
                string(socs.opt(j), at + ".socs[" + j + "]");
            }
            for (String name : new String[] {"soc", "precision", "path"}) {
                string(field(binary, name, at + "." + name), at + "." + name);
            }
            expect(field(binary, "min_runtime_qnn", at + ".min_runtime_qnn"), at + ".min_runtime_qnn",
                    "a string or null", true, "string", "null");
            string(field(binary, "min_runtime_from", at + ".min_runtime_from"), at + ".min_runtime_from");
            if (binary.has("memory")) {
                JSONObject memory = mapping(binary.opt("memory"), at + ".memory");
                Object needed = field(memory, "resident_bytes", at + ".memory.resident_bytes");
                expect(needed, at + ".memory.resident_bytes", "a non-negative integer",
                        kind(needed).equals("integer") && ((Number) needed).longValue() >= 0, "integer");
            }
        }
        if (entry.has("size")) {
            JSONObject size = mapping(entry.opt("size"), key + ".size");
            for (String name : new String[] {"of", "dim"}) {
                string(field(size, name, key + ".size." + name), key + ".size." + name);
            }
            size(field(size, "size", key + ".size.size"), key + ".size.size");
        }
    }

    /** A value's JSON kind, in the words of the reasons (select.py's _kind gives the same). */
    public static String kind(Object value) {
        if (value == null || value == JSONObject.NULL) {
            return "null";
        }
        if (value instanceof Boolean) {
            return "boolean";
        }
        if (value instanceof Integer || value instanceof Long || value instanceof Short || value instanceof Byte
                || value instanceof BigInteger) {
            return "integer";
        }
        if (value instanceof Number) {
            return "number";
        }
        if (value instanceof String) {
            return "string";
        }
        if (value instanceof JSONObject) {
            return "mapping";
        }
        if (value instanceof JSONArray) {
            return "list";
        }
        return value.getClass().getSimpleName();
    }

    private static String a(String kind) {
        return kind.equals("null") ? kind : ("aeiou".indexOf(kind.charAt(0)) >= 0 ? "an " : "a ") + kind;
    }

    /** value is one of kinds and ok, else the field's one line: "expected what[, got kind]". */
    private static Object expect(Object value, String key, String what, boolean ok, String... kinds) {
        String kind = kind(value);
        if (!Arrays.asList(kinds).contains(kind)) {
            throw new Bad(key + ": expected " + what + ", got " + a(kind));
        }
        if (!ok) {
            throw new Bad(key + ": expected " + what);
        }
        return value;
    }

    private static Object field(JSONObject o, String name, String key) {
        if (!o.has(name)) {
            throw new Bad(key + ": missing");
        }
        return o.opt(name);
    }

    private static JSONObject mapping(Object value, String key) {
        return (JSONObject) expect(value, key, "a mapping", true, "mapping");
    }

    private static JSONArray list(Object value, String key, boolean empty) {
        if (empty) {
            return (JSONArray) expect(value, key, "a list", true, "list");
        }
        return (JSONArray) expect(value, key, "a non-empty list", value instanceof JSONArray
                && ((JSONArray) value).length() > 0, "list");
    }

    private static void string(Object value, String key) {
        expect(value, key, "a non-empty string", !"".equals(value), "string");
    }

    private static void size(Object value, String key) {
        boolean whole = false;
        if (kind(value).equals("integer")) {
            BigInteger v = value instanceof BigInteger ? (BigInteger) value
                    : BigInteger.valueOf(((Number) value).longValue());
            whole = v.signum() > 0 && v.compareTo(BigInteger.valueOf(MAX_SIZE)) <= 0;
        }
        expect(value, key, "an integer from 1 to " + MAX_SIZE, whole, "integer");
    }

    private static boolean finite(Object value) {
        if (!(value instanceof Number)) {
            return false;
        }
        double v = ((Number) value).doubleValue();
        return !Double.isNaN(v) && !Double.isInfinite(v);
    }

    /** The graph's CPU fallback as far as a bad manifest still names one (a non-empty string), else null. */
    private static String fallbackOf(Object manifest, String graph) {
        Object graphs = manifest instanceof JSONObject ? ((JSONObject) manifest).opt("graphs") : null;
        Object entry = graphs instanceof JSONObject && graph != null ? ((JSONObject) graphs).opt(graph) : null;
        Object fallback = entry instanceof JSONObject ? ((JSONObject) entry).opt("fallback") : null;
        Object path = fallback instanceof JSONObject ? ((JSONObject) fallback).opt("path") : null;
        return path instanceof String && !((String) path).isEmpty() ? (String) path : null;
    }

    /**
     * Rule 4 for one binary: why a device with freeMemoryMb MiB free cannot hold it loaded (its manifest
     * memory.resident_bytes), or null; a device that declares nothing, or a binary without the figure, is not refused.
     */
    public static String memoryRefusal(JSONObject binary, Integer freeMemoryMb) {
        JSONObject memory = binary.optJSONObject("memory");
        if (freeMemoryMb == null || memory == null || !memory.has("resident_bytes")) {
            return null;
        }
        long needed = memory.optLong("resident_bytes");
        if (needed <= (long) freeMemoryMb * MIB) {
            return null;
        }
        return label(binary) + " needs " + ((needed + MIB - 1) / MIB) + " MiB resident, the device has "
                + freeMemoryMb + " MiB free";
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
