"""One qnn-net-run on the phone, and the steps around it.

`run_script` / `run_on_device`  shell text that runs qnn-net-run in the device folder with LD_LIBRARY_PATH
                                and ADSP_LIBRARY_PATH set, times it on the device clock and samples its
                                /proc/<pid>/stat; `parse_run` reads what it printed (exit code, seconds,
                                log, CPU use via `cpu_use`);
push (same size and md5 skipped), the runner's arguments, its failure as one message, cleanup of the
device folder.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from qnn_tasks.devices import adb
from qnn_tasks.errors import StageError
from qnn_tasks.stages.verify.payload import Payload
from qnn_tasks.stages.verify.settings import DEFAULT_ADSP_PATH, ENV_KEEP, RUNNER, SCRIPT_MARK, DeviceSettings, Job


@dataclass
class RunResult:
    returncode: int
    seconds: float | None
    output: str
    cpu: dict[str, Any] | None


def run_script(workdir: str, args: list[str], log: str, period: float, out: str) -> str:
    """Shell text that runs qnn-net-run in `workdir`, times it on the device and samples its /proc/<pid>/stat."""
    q = shlex.quote
    lib = f"{workdir}/lib"
    every = max(1, round(period / 0.1))
    command = " ".join(q(a) for a in [f"./{RUNNER}", *args])
    return "\n".join([
        f"cd {q(workdir)} || exit 97",
        f'export LD_LIBRARY_PATH={q(lib)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        f'export ADSP_LIBRARY_PATH={q(lib + ";")}"${{ADSP_LIBRARY_PATH:-{DEFAULT_ADSP_PATH}}}"',
        "qt_now() { d=$(date +%s%N 2>/dev/null); case \"$d\" in ''|*N*) "
        "awk '{printf \"%.0f\\n\", $1*1000000000}' /proc/uptime;; *) echo \"$d\";; esac; }",
        f"rm -rf {q(out)} {q(log)} {q(log + '.pid')} {q(log + '.time')} {q(log + '.times')}",
        # the subshell's only long-lived child is the runner: `times` after `wait` gives its total CPU time
        f"( t0=$(qt_now); {command} >{q(log)} 2>&1 & p=$!; echo $p >{q(log + '.pid')}; wait $p; rc=$?; "
        f"t1=$(qt_now); times >{q(log + '.times')}; echo \"$rc $t0 $t1\" >{q(log + '.time')} ) &",
        f"while [ ! -s {q(log + '.pid')} ]; do sleep 0.05; done",
        f"pid=$(cat {q(log + '.pid')})",
        f"echo \"{SCRIPT_MARK}CLK_TCK $(getconf CLK_TCK 2>/dev/null || echo 100)\"",
        "n=0",
        f"while [ ! -s {q(log + '.time')} ]; do",
        f"  if [ $((n % {every})) -eq 0 ]; then s=$(cat /proc/$pid/stat 2>/dev/null) && "
        f"echo \"{SCRIPT_MARK}STAT $(qt_now) $s\"; fi",
        "  n=$((n+1)); sleep 0.1",
        "done",
        "wait",
        f"read rc t0 t1 < {q(log + '.time')}",
        f"echo \"{SCRIPT_MARK}TIME $rc $t0 $t1\"",
        f"echo \"{SCRIPT_MARK}CHILDREN $(tail -n 1 {q(log + '.times')})\"",
        f"echo {SCRIPT_MARK}LOG_BEGIN; tail -c 65536 {q(log)}; echo; echo {SCRIPT_MARK}LOG_END",
        "exit $rc",
    ])


def run_on_device(phone: adb.Phone, workdir: str, args: list[str], log: str, what: str, period: float,
                  timeout: float) -> RunResult:
    out = args[args.index("--output_dir") + 1]
    result = phone.shell(run_script(workdir, args, log, period, out), what, timeout=timeout)
    return parse_run(result.returncode, result.stdout + result.stderr)


def parse_run(returncode: int, text: str) -> RunResult:
    tck, samples, seconds, total_cpu, in_log, log_lines = 100, [], None, None, False, []
    for line in text.splitlines():
        if in_log:
            if line == f"{SCRIPT_MARK}LOG_END":
                in_log = False
            else:
                log_lines.append(line)
            continue
        if line == f"{SCRIPT_MARK}LOG_BEGIN":
            in_log = True
        elif line.startswith(f"{SCRIPT_MARK}CLK_TCK "):
            tck = int(line.split()[1]) if line.split()[1].isdigit() else 100
        elif line.startswith(f"{SCRIPT_MARK}STAT "):
            _, stamp, stat = line.split(" ", 2)
            ticks = proc_ticks(stat)
            if ticks is not None and stamp.isdigit():
                samples.append((int(stamp), ticks))
        elif line.startswith(f"{SCRIPT_MARK}CHILDREN "):
            times = re.findall(r"(\d+)m([\d.]+)s", line)
            if len(times) == 2:
                total_cpu = sum(int(m) * 60 + float(sec) for m, sec in times)
        elif line.startswith(f"{SCRIPT_MARK}TIME "):
            parts = line.split()
            if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                seconds = (int(parts[3]) - int(parts[2])) / 1e9
                returncode = int(parts[1]) if parts[1].lstrip("-").isdigit() else returncode
        else:
            log_lines.append(line)
    output = "\n".join(log_lines).strip()
    return RunResult(returncode, seconds, output, cpu_use(samples, tck, total_cpu, seconds))


def proc_ticks(stat: str) -> int | None:
    """utime + stime (clock ticks) from a /proc/<pid>/stat line (the comm may hold spaces)."""
    try:
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def cpu_use(samples: list[tuple[int, int]], tck: int, total_cpu_s: float | None = None,
            wall_s: float | None = None) -> dict[str, Any]:
    """CPU use of the runner process: /proc/<pid>/stat (utime+stime) sampled every period, and its total
    CPU time at exit (the shell's `times` for its reaped child), over the run's wall time."""
    result: dict[str, Any] = {"cores": None, "clk_tck": tck, "samples": len(samples),
                              "method": "(utime+stime) of the runner / CLK_TCK / elapsed: sampled from /proc/<pid>/stat "
                                        "during the run, and in total at exit (shell `times` of the reaped runner)"}
    if len(samples) >= 2:
        (t0, k0), (t1, k1) = samples[0], samples[-1]
        window = (t1 - t0) / 1e9
        if window > 0:
            result.update(sampled_cores=(k1 - k0) / tck / window, sampled_window_s=window,
                          series=[[round((t - t0) / 1e9, 3), k] for t, k in samples[:200]])
    if total_cpu_s is not None and wall_s:
        result.update(cores=total_cpu_s / wall_s, cpu_seconds=total_cpu_s, wall_s=wall_s)
    elif "sampled_cores" in result:
        result["cores"] = result["sampled_cores"]
    if result["cores"] is not None:
        result["percent_of_one_core"] = result["cores"] * 100
    else:
        result["note"] = "no CPU figure: the run ended before a second /proc/<pid>/stat sample and `times` gave nothing"
    return result


def runner_args(bin_name: str, input_list: str, out: str, native: bool, extra: list[str] = ()) -> list[str]:
    args = ["--retrieve_context", bin_name, "--backend", "lib/libQnnHtp.so", "--input_list", input_list,
            "--output_dir", out]
    if native:
        args.append("--use_native_input_files")
    return args + list(extra)


def require_ok(run: RunResult, phone: adb.Phone, what: str, log_file: Path, soc: Any = None,
               error: type[StageError] = StageError) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(run.output + "\n")
    if run.returncode == 0:
        return
    tail = "\n".join(run.output.splitlines()[-15:]) or "(no output)"
    hint = {126: " (not executable: is it the aarch64-android build?)", 127: " (not found or cannot start)",
            97: " (the device folder is gone)"}.get(run.returncode, "")
    from qnn_tasks.qnn.errorcodes import explain, suffix

    hint += suffix(explain(run.output, "phone", soc=soc))  # e.g. 5000/5005: runtime libs older than the compiler
    raise error(f"{RUNNER} exited with {run.returncode}{hint} on {phone.info.label()} during {what}; its "
                     f"output: {tail} (full log: {log_file})")


def push_payload(job: Job, phone: adb.Phone, payload: Payload, workdir: str, entry: dict[str, Any],
          save: Callable[[], None]) -> None:
    entry.update(phase="push", device_folder=workdir)
    save()
    report = phone.push_tree(payload.files, workdir, payload.executable)
    phone.check(f"cd {shlex.quote(workdir)} && chmod 755 {RUNNER} && rm -rf inputs && tar -xf inputs.tar",
                "unpacking the inputs")
    entry["push"] = report.as_dict()
    save()
    print(f"{job.stage}:{job.target}: {phone.info.label()}: pushed {len(report.pushed)} file(s), "
          f"{len(report.skipped)} already there (same size and md5)", flush=True)


def cleanup(job: Job, phone: adb.Phone, workdir: str, settings: DeviceSettings, entry: dict[str, Any]) -> None:
    if settings.keep_files:
        entry["device_files"] = f"kept in {workdir} ({ENV_KEEP}=1 or settings.device.keep_files)"
    elif phone.remove(workdir):
        entry["device_files"] = "removed"
    else:
        entry["device_files"] = f"not removed ({workdir}): the device is gone"
