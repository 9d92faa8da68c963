"""verify / power: run a chip target's context binary on attached phones over adb (docs/phones.md).

`survey`        build/verify/devices.json: every attached device, its chip (ro.soc.model matched to
                socs/socs.yaml) and which targets it runs; a phone whose chip has no build is listed as
                "CPU fallback: no build for <chip>". No phone at all, or none that can run a build: fails.
`verify_target` for one chip target, on each attached device of that chip (ro.soc.model matched exactly, the
                package selector's rule 1); the device's record gets the selector's `decision` (npu, or cpu with
                the reason: runtime too old, the first run failed), as an app shipping the package would decide:
                1. refuse before pushing anything: a binary whose socModel/arch is not the device's chip,
                   or runtime libs to ship older than the binary's minimum runtime: the one `doit compat`
                   measured for this exact binary (build/compat/compat.json), else its QNN build (err
                   5000/5005 on the phone); missing runtime libs for the arch (named);
                2. push (skipping files already there with the same size and md5) into
                   /data/local/tmp/<project>/<target>/: lib/ (libQnnHtp, libQnnSystem, V<NN>Stub, V<NN>Skel),
                   qnn-net-run, the context binary, the verification inputs as raw files + input_list.txt;
                3. `qnn-net-run --retrieve_context <bin> --backend lib/libQnnHtp.so --input_list input_list.txt
                   --output_dir out` with LD_LIBRARY_PATH and ADSP_LIBRARY_PATH (';'-separated, lib/ first);
                   its process's /proc/<pid>/stat is sampled every 2 s (CPU use);
                4. pull Result_<i>/<output>.raw (float32) and judge them against cpucheck's CPU reference with
                   the same metrics, thresholds and checks as simverify (verification.judge);
                5. latency: wall time on the device of runs with 1 inference (first output: load + 1) and with
                   N inferences (--num_inferences), per round; per inference = (T_N - T_1) / (N - 1); median
                   and p90 over the rounds; real-time factor where the graph gives options.audio_seconds_per_sample;
                6. remove the device folder unless asked to keep it.
                The record (<chip dir>/verify/verify.json) is rewritten after every step, so a phone that is
                unplugged mid-run leaves what was measured, and the other phones still run.
`power_target`  the opt-in fixed-length run: inference repeated for N seconds, battery level/charge from
                `dumpsys battery` before and after, CPU use; <chip dir>/power/power.json.

Plain functions, no doit: the rows' runners `run_call` / `power_call` (flow.py) decode the plan's call into a Job;
they write their own records (the funnel's one record per run cannot be rewritten after every step), and the task
layer turns their exceptions (QnnTasksError) into one-line task failures.

The package, one module per job (each imports only the ones above it):
    settings.py    DeviceSettings / device_settings, the Job, device folder names, the report's stamp
    survey.py      build/verify/devices.json: survey, classify
    choice.py      what runs on this phone: the package selector's rules (qnn_tasks/qnn/select.py): decide
    refusal.py     checks before pushing: binary_facts, refuse_incompatible, refused
    payload.py     what goes to the phone and comes back: build_payload, read_outputs
    device_run.py  one qnn-net-run on the phone: run_script, run_on_device, parse_run, cpu_use, push, cleanup
    measure.py     latency, CPU use, real-time factor: measure_latency, best_cpu, real_time_factor
    power.py       the `doit power` run on one phone: battery, battery_drop
    flow.py        verify_target / power_target over the attached phones of the target's chip
"""
from __future__ import annotations

# The rows' runners (plan/rows.py) and what they run; everything else is imported from its own module.
from qnn_tasks.stages.verify.flow import power_call, power_target, run_call, verify_target
from qnn_tasks.stages.verify.settings import Job
from qnn_tasks.stages.verify.survey import survey

__all__ = ["Job", "power_call", "power_target", "run_call", "survey", "verify_target"]
