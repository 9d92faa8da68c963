"""Will this binary load on that phone? A prediction from the binary's own fields, before any phone is in hand.

For a built context binary, a SoC row (docs/socs.md) and a runtime QNN version, `predict` says what a phone would
see: it loads; it loads but recompilation is preferred; or it is refused, with the QNN error code and the reason.
The facts come from the binary itself, never its file name: the `ep_compatibility_info.QNNExecutionProvider`
metadata the QNN EP writes into every `_ctx.onnx` (`v2:<backend>:<QNN SDK>:<backend API>:<htp archs>:<soc models>:
<VTCM MBs>:<user driver>`), and what qnn/binary.py reads from the `.bin` (soc_model, dsp_arch), or a manifest
binary's copy of both (`qnn_version`, `soc_model`, `dsp_arch`).

RULES is the one decision table (first match decides), each rule with its public source (docs/load-and-fit.md).
The version rule is the selectors' own (`select.runtime_refusal`, Selector.java's twin), so the selectors and the
oracle cannot disagree on it; `choose` is `select.choose` with the oracle's prediction as the load callback. The
arch and VTCM rules are the QNN EP's (onnxruntime-qnn ValidateCompatibilityInfoV2, PRs #482 and #806). Only the
version rule is measured here (`doit compat`: the x86 simulator loads a binary under any soc_model, htp_arch or
vtcm_mb it is told); the chip rules are predictions.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

from qnn_tasks.qnn import select

EP_KEY = "ep_compatibility_info.QNNExecutionProvider"
HTP_BACKEND_ID = 6          # QNN_BACKEND_ID_HTP: what every binary of this project records
ARCH_BREAK = 73             # the QNN EP's kHtpV6xAndV7xBreakageArch: a v6x binary does not run on v73 and later

LOADS = "loads"
RECOMPILE = "loads, recompilation preferred"
REFUSED = "refused"
_RANK = {LOADS: 0, RECOMPILE: 1, REFUSED: 2}

PR_482 = "onnxruntime-qnn PR #482 (ValidateCompatibilityInfoV2)"
PR_806 = "onnxruntime-qnn PR #806 (soc_model over htp_arch)"


@dataclass(frozen=True)
class Rule:
    name: str        # the Prediction.rule it gives
    outcome: str     # LOADS | RECOMPILE | REFUSED
    code: str | None  # the QNN error a phone's log would show (None: refused by ONNX Runtime before QNN sees it)
    when: str        # the condition, in words (docs/load-and-fit.md prints this table)
    source: str      # where the rule comes from


# The one decision table, in order: the first rule whose condition holds decides.
RULES: tuple[Rule, ...] = (
    Rule("unreadable", REFUSED, None, "the binary records no QNN version (no ep_compatibility_info, no qnn_version)",
         "this project: nothing to compare is nothing to promise"),
    Rule(select.RUNTIME_UNKNOWN, REFUSED, "14001", "the device's runtime QNN version is unknown (libraries absent)",
         "qnn_errors.yaml 14001 (missing HTP libraries); select.py rule 3"),
    Rule("backend", REFUSED, None, "the binary's QNN backend is not the HTP (backend id 6)",
         f"{PR_482}: backend id must match"),
    Rule(select.RUNTIME_OLDER, REFUSED, select.CODE, "the binary's QNN version is newer than the runtime's",
         f"{PR_482} and PR #366 (backend API / SDK version <= the runtime's); measured by doit compat (QNN 2.51 "
         f"binary on the QNN 2.47 runtime: error 5000); select.runtime_refusal"),
    Rule("arch-generation", REFUSED, "5005", f"the binary's HTP arch is below v{ARCH_BREAK}, the device's v{ARCH_BREAK} "
         "or newer", f"{PR_482}: kHtpV6xAndV7xBreakageArch = {ARCH_BREAK}"),
    Rule("arch-newer", REFUSED, "5005", "the binary's HTP arch is newer than the device's",
         f"{PR_482}: cache htp_arch > runtime htp_arch is unsupported"),
    Rule("vtcm", REFUSED, None, "the binary asks for more VTCM than the device has",
         f"{PR_482}: cache vtcm_mb > runtime vtcm_mb is unsupported"),
    Rule("arch-older", RECOMPILE, None, "the binary's HTP arch is older than the device's (same generation)",
         f"{PR_482}: only an identical arch and VTCM is optimal"),
    Rule("vtcm-smaller", RECOMPILE, None, "the binary asks for less VTCM than the device has",
         f"{PR_482}: only an identical arch and VTCM is optimal"),
    Rule("soc-model", RECOMPILE, None, "same arch and VTCM, another soc_model: the EP does not compare soc_model, "
         "but the binary was not verified on this chip (the selectors refuse a chip the manifest does not list)",
         f"{PR_806}; select.py rule 1"),
    Rule(select.OUT_OF_MEMORY, REFUSED, select.MEMORY_CODE, "the binary's resident memory (the manifest's "
         "memory.resident_bytes) is more than the free memory the device declares",
         "ExecuTorch #15954 (\"estimated allocation of 2315388 KB, limit is 2097152 KB\"); QNN error 1002 "
         "MEM_ALLOC; select.memory_refusal (a device fact, not a chip row's: the selectors apply it)"),
    Rule("match", LOADS, None, "same soc_model, arch and VTCM, runtime at least the binary's QNN version",
         f"{PR_482}: identical arch and VTCM is optimal"),
)
RULE = {r.name: r for r in RULES}


@dataclass(frozen=True)
class BinaryFacts:
    """What a binary says about itself (None: it does not say)."""
    qnn_version: str | None              # the QNN SDK that built it, e.g. "2.51.0"
    backend_id: int | None = HTP_BACKEND_ID
    backend_api: str | None = None       # e.g. "5.51.0"
    soc_models: tuple[int, ...] = ()     # from the ep_compatibility_info, else the .bin's socModel
    archs: tuple[int, ...] = ()          # per soc_model; 0 = not given at compile (the EP then skips its arch check)
    vtcm_mbs: tuple[int, ...] = ()       # per soc_model; 0 = not given
    bin_arch: int | None = None          # the .bin's own dsp_arch (qnn/binary.py), e.g. 75
    source: str = "?"                    # where the facts were read

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    outcome: str                 # LOADS | RECOMPILE | REFUSED
    code: str | None             # the QNN error code a phone would log, when refused and known
    rule: str                    # the RULES entry that decided
    reason: str                  # one line, naming the facts compared
    ort_score: str | None = None  # what the QNN EP's own validator would score the ep_compatibility_info
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def loads(self) -> bool:
        return self.outcome != REFUSED

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loads": self.loads}


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip() != "")


def parse_compat_info(text: str | None) -> dict[str, Any] | None:
    """The QNN EP's v2 compatibility string as fields, or None when it is absent or not that format."""
    parts = str(text).split(":") if text else []
    if len(parts) != 8 or parts[0] != "v2":
        return None
    try:
        archs, socs, vtcm = _ints(parts[4]), _ints(parts[5]), _ints(parts[6])
        backend = int(parts[1])
    except ValueError:
        return None
    if not (len(archs) == len(socs) == len(vtcm)):
        return None
    return {"backend_id": backend, "sdk": parts[2], "backend_api": parts[3], "archs": archs, "soc_models": socs,
            "vtcm_mbs": vtcm, "user_driver": parts[7] == "1"}


def arch_number(dsp_arch: Any) -> int | None:
    """'v75' -> 75; None when it is no arch."""
    text = str(dsp_arch or "").lower().lstrip("v")
    return int(text) if text.isdigit() else None


def facts(ep_info: str | None, binary_info: Mapping[str, Any] | None = None, source: str = "?") -> BinaryFacts:
    """A built binary's facts: its `_ctx.onnx` ep_compatibility_info over qnn/binary.py's info dict of the `.bin`
    (build_id "v2.51.0.251023", soc_model, dsp_arch)."""
    info = binary_info or {}
    parsed = parse_compat_info(ep_info)
    build = select.version(info.get("build_id"))
    bin_arch = arch_number(info.get("dsp_arch"))
    if parsed:
        return BinaryFacts(parsed["sdk"], parsed["backend_id"], parsed["backend_api"], parsed["soc_models"],
                           parsed["archs"], parsed["vtcm_mbs"], bin_arch, source)
    soc = info.get("soc_model")
    return BinaryFacts(".".join(map(str, build[:3])) if build else None, HTP_BACKEND_ID, None,
                       (int(soc),) if soc else (), (bin_arch or 0,) if soc else (), (0,) if soc else (), bin_arch,
                       source)


def manifest_facts(binary: Mapping[str, Any]) -> BinaryFacts:
    """A manifest binary's facts: its ep_compatibility_info when the manifest carries it, else its qnn_version,
    soc_model and dsp_arch (what dist copied from the binary)."""
    if binary.get("ep_compatibility_info"):
        found = facts(binary["ep_compatibility_info"], {"dsp_arch": binary.get("dsp_arch")}, "manifest")
        if found.qnn_version:
            return found
    soc, arch = binary.get("soc_model"), arch_number(binary.get("dsp_arch"))
    return BinaryFacts(binary.get("qnn_version"), HTP_BACKEND_ID, None, (int(soc),) if soc else (),
                       (arch or 0,) if soc else (), (0,) if soc else (), arch, "manifest")


def ort_score(f: BinaryFacts, arch: int, vtcm: int, runtime: tuple[int, ...]) -> str | None:
    """ValidateCompatibilityInfoV2 of the QNN EP, literally, on the binary's ep_compatibility_info fields: OPTIMAL,
    PREFER_RECOMPILATION or UNSUPPORTED (SDK versions stand in for backend API versions: both move together).
    An arch of 0 (not given at compile, as every binary built with soc_model only) skips the arch check, and never
    equals the device's: the EP scores such a binary PREFER_RECOMPILATION at best."""
    needed = select.version(f.qnn_version)
    if not f.archs or needed is None:
        return None
    if f.backend_id != HTP_BACKEND_ID or select.older(runtime, needed):
        return "UNSUPPORTED"
    best = "UNSUPPORTED"
    for cache_arch, cache_vtcm in zip(f.archs, f.vtcm_mbs or (0,) * len(f.archs)):
        if (cache_arch and cache_arch < ARCH_BREAK <= arch) or cache_arch > arch or cache_vtcm > vtcm:
            score = "UNSUPPORTED"
        elif cache_arch == arch and cache_vtcm == vtcm:
            score = "OPTIMAL"
        else:
            score = "PREFER_RECOMPILATION"
        best = min(best, score, key=["OPTIMAL", "PREFER_RECOMPILATION", "UNSUPPORTED"].index)
    return best


def _entries(f: BinaryFacts) -> list[tuple[int | None, int | None, int]]:
    """(soc_model, arch, vtcm) per chip the binary is for; the arch is the .bin's own when the ep info gives 0."""
    if not f.soc_models:
        return [(None, f.bin_arch, 0)]
    vtcm = f.vtcm_mbs or (0,) * len(f.soc_models)
    archs = f.archs or (0,) * len(f.soc_models)
    return [(s, a or f.bin_arch, v) for s, a, v in zip(f.soc_models, archs, vtcm)]


def predict(f: BinaryFacts, soc: Mapping[str, Any], runtime_qnn: str | None, path: str = "the binary") -> Prediction:
    """What a phone of SoC row `soc` (name, soc_id, dsp_arch, vtcm_mb) with runtime libraries of QNN `runtime_qnn`
    (None: absent or unknown) would see loading the binary of facts `f`."""
    name, soc_id = soc.get("name", "?"), soc.get("soc_id")
    arch, vtcm = arch_number(soc.get("dsp_arch")) or 0, int(soc.get("vtcm_mb") or 0)
    seen = f.as_dict()

    def decide(rule: str, reason: str, score: str | None = None) -> Prediction:
        r = RULE[rule]
        return Prediction(r.outcome, r.code, rule, reason, score, seen)

    if select.version(f.qnn_version) is None:
        return decide("unreadable", f"{path} records no QNN version ({f.source}): its load cannot be predicted")
    runtime = select.version(runtime_qnn)
    if runtime is None:
        absent = runtime_qnn or "libraries absent"
        return decide(select.RUNTIME_UNKNOWN, f"runtime libraries' QNN version unknown ({absent}) on {name}: "
                                              f"nothing loads without them")
    score = ort_score(f, arch, vtcm, runtime)
    if f.backend_id != HTP_BACKEND_ID:
        return decide("backend", f"{path} is for QNN backend {f.backend_id}, the phone runs the HTP "
                                 f"({HTP_BACKEND_ID})", score)
    binary = {"min_runtime_qnn": f.qnn_version, "min_runtime_from": f"the binary's {f.source}",
              "precision": "", "path": path}
    refusal = select.runtime_refusal(binary, runtime)  # the selectors' own version rule
    if refusal:
        return decide(select.RUNTIME_OLDER, f"runtime QNN {runtime_qnn} on {name} is older than the binary: "
                                            f"{refusal.strip()} (QNN error {select.CODE})", score)
    best: Prediction | None = None
    for b_soc, b_arch, b_vtcm in _entries(f):
        found = _chip(path, name, soc_id, arch, vtcm, b_soc, b_arch, b_vtcm, runtime_qnn, f.qnn_version)
        guess = decide(found[0], found[1], score)
        if best is None or _RANK[guess.outcome] < _RANK[best.outcome] or (b_soc == soc_id and
                                                                           guess.outcome == best.outcome):
            best = guess
    assert best is not None
    return best


def _chip(path: str, name: str, soc_id: Any, arch: int, vtcm: int, b_soc: int | None, b_arch: int | None,
          b_vtcm: int, runtime_qnn: str | None, qnn: str | None) -> tuple[str, str]:
    """(rule, reason) of one chip entry of the binary against the device, version already fine."""
    there = f"{name} (soc_model {soc_id}, v{arch}, VTCM {vtcm} MB)"
    built = f"{path} (soc_model {b_soc if b_soc is not None else '?'}, v{b_arch or '?'}, VTCM {b_vtcm or '?'} MB)"
    if b_arch and b_arch < ARCH_BREAK <= arch:
        return "arch-generation", f"{built} on {there}: a v6x binary does not run on v{ARCH_BREAK}+ (QNN error 5005)"
    if b_arch and b_arch > arch:
        return "arch-newer", f"{built} on {there}: the binary's arch is newer than the chip's (QNN error 5005)"
    if b_vtcm and b_vtcm > vtcm:
        return "vtcm", f"{built} on {there}: the binary needs {b_vtcm} MB of VTCM, the chip has {vtcm} MB"
    if b_arch and b_arch < arch:
        return "arch-older", f"{built} on {there}: an older arch runs, a build for v{arch} would be better"
    if b_vtcm and b_vtcm < vtcm:
        return "vtcm-smaller", f"{built} on {there}: it uses {b_vtcm} of {vtcm} MB of VTCM, a rebuild would use all"
    if b_soc is not None and b_soc != soc_id:
        return "soc-model", f"{built} on {there}: another chip of the same arch; not verified there"
    return "match", f"{built} on {there}: built for this chip, runtime QNN {runtime_qnn} >= {qnn}"


def load_callback(soc: Mapping[str, Any], runtime_qnn: str | None) -> Callable[[Mapping[str, Any]], str | None]:
    """A `load` for `select.choose`: None when the oracle predicts the binary loads on this device, else why not
    (each binary judged on its own fields)."""

    def load(binary: Mapping[str, Any]) -> str | None:
        p = predict(manifest_facts(binary), soc, runtime_qnn, str(binary.get("path")))
        return None if p.loads else f"predicted refused: {p.reason}"

    return load


def choose(manifest: Mapping[str, Any], graph: str, soc: Mapping[str, Any], runtime_qnn: str | None,
           free_memory_mb: int | None = None) -> select.Decision:
    """The selectors' decision with the oracle's prediction standing in for the phone's load."""
    return select.choose(manifest, graph, soc.get("name"), runtime_qnn, load_callback(soc, runtime_qnn),
                         free_memory_mb)


def matrix(f: BinaryFacts, socs: Sequence[Mapping[str, Any]], versions: Sequence[str], path: str
           ) -> dict[str, dict[str, dict[str, Any]]]:
    """Every SoC row x every runtime QNN version: {soc: {qnn: {outcome, code, rule}}}."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in socs:
        out[row["name"]] = {}
        for qnn in versions:
            p = predict(f, row, qnn, path)
            out[row["name"]][qnn] = {"outcome": p.outcome, "code": p.code, "rule": p.rule}
    return out


def tally(matrices: Sequence[Mapping[str, Mapping[str, Mapping[str, Any]]]]) -> dict[str, int]:
    """How many predictions of these matrices give each outcome."""
    counts = {LOADS: 0, RECOMPILE: 0, REFUSED: 0}
    for m in matrices:
        for by_version in m.values():
            for p in by_version.values():
                counts[p["outcome"]] += 1
    return counts


def agrees(prediction: Mapping[str, Any], measured: Mapping[str, Any]) -> bool:
    """A measured simulator load against a prediction: the same load or refusal, and a refusal's measured code
    (when the log gave one) among the predicted codes."""
    if bool(prediction.get("loads")) != bool(measured.get("loads")):
        return False
    code = measured.get("error_code")
    if measured.get("loads") or not code or not prediction.get("code"):
        return True
    return code_number(code) in str(prediction["code"]).split("/")


def code_number(code: Any) -> str:
    """A measured error code as its number: "5000", or a QNN error name looked up in qnn_errors.yaml."""
    from qnn_tasks.qnn.errorcodes import catalogue

    text = str(code)
    return next((str(n) for n, entry in catalogue().items() if entry.get("name") == text), text)
