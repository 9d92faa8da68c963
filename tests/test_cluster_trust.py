"""A Dask cluster a team can trust: losing it fails the build in one line, TLS keeps strangers out.

Real components only: `dask scheduler` and `dask worker` started with Dask's own CLI on 127.0.0.1
(DASK_CONFIG pointing at cluster/, as the README says), real doit runs of the tiny project whose
heavy calls go to the cluster, certificates made by cluster/tls/make-certs.sh (openssl).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import ROOT, Project
from test_faults import Running
from test_team import free_port, start, stop
from tiny_project import tiny_project

from qnn_tasks.run.executors.dask import CONNECT_TIMEOUT_S, connect_timeout_s

pytestmark = pytest.mark.slow  # real Dask schedulers and workers, started and killed: tens of seconds each

CLUSTER = ROOT / "cluster"


def cluster_env(config: Path = CLUSTER) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "QNN_EXECUTOR": "", "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
            "DASK_CONFIG": str(config)}


def start_cluster(tmp: Path, config: Path = CLUSTER, protocol: str = "tcp") -> dict:
    """The README's commands with 127.0.0.1 as the interface: one scheduler, one worker."""
    port = free_port()
    env = cluster_env(config)
    scheduler = start(["dask", "scheduler", "--protocol", protocol, "--host", "127.0.0.1", "--port", str(port),
                       "--dashboard-address", "127.0.0.1:0"], env, tmp / "scheduler.log")
    address = f"{protocol}://127.0.0.1:{port}"
    worker = start_worker(tmp, address, env)
    return {"address": address, "port": port, "scheduler": scheduler, "worker": worker, "env": env}


def start_worker(tmp: Path, address: str, env: dict[str, str], name: str = "worker") -> subprocess.Popen:
    return start(["dask", "worker", address, "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
                  "--nthreads", "1", "--nworkers", "1", "--local-directory", str(tmp / "dask-worker")],
                 env, tmp / f"{name}.log")


def wait_for_workers(cluster: dict, count: int = 1, security=None) -> None:
    from distributed import Client

    deadline = time.monotonic() + 120
    with Client(cluster["address"], timeout=60, security=security) as client:
        while len(client.scheduler_info()["workers"]) < count:
            assert time.monotonic() < deadline, "no worker joined"
            time.sleep(0.3)


def wait_for_call(worker: subprocess.Popen, run: Running) -> None:
    """Until the Dask worker runs a call: its stage child process (executors.worker) is alive."""
    deadline = time.monotonic() + 120
    while True:
        children = psutil.Process(worker.pid).children(recursive=True)
        if any("qnn_tasks.run.executors.worker" in " ".join(c.cmdline()) for c in children if c.is_running()):
            time.sleep(1.0)  # inside the simulator
            return
        assert time.monotonic() < deadline and run.proc.poll() is None, "the call never reached the worker"
        time.sleep(0.1)


def stop_cluster(cluster: dict) -> None:
    for name in ("worker", "scheduler"):
        stop(cluster[name])


def records_of(project: Project, stage: str) -> dict[str, dict]:
    found = {}
    for path in project.root.glob(f"build/tiny/tiny/*/fp16/*/{stage}/{stage}.json"):
        record = json.loads(path.read_text())
        found[f"{record['stage']}:{record['target']}"] = record
    return found


def dask_env(tmp: Path, address: str, config: Path = CLUSTER) -> dict[str, str]:
    return {"QNN_EXECUTOR": address.replace("tcp://", "dask://"), "QNN_CACHE": str(tmp / "store"),
            "DASK_CONFIG": str(config)}


# ------------------------------------------------------------------ losing the scheduler

def test_losing_the_scheduler_mid_build_fails_its_targets_in_one_line(tmp_path):
    cluster = start_cluster(tmp_path)
    try:
        wait_for_workers(cluster)
        project = tiny_project(tmp_path / "project", socs=("SM8650", "SM8750"), samples=100)
        run = Running(project, env=dask_env(tmp_path, cluster["address"]))
        run.wait_for(".  simulate:tiny-SM8650", timeout=600)
        wait_for_call(cluster["worker"], run)
        stop(cluster["scheduler"], signal.SIGKILL)
        lost = time.monotonic()
        code, stderr = run.finish()
        took = time.monotonic() - lost
    finally:
        stop_cluster(cluster)
    output = "\n".join(run.lines) + stderr
    assert code != 0, output
    assert "Traceback" not in output and "CancelledError" not in output, output
    for soc in ("SM8650", "SM8750"):
        lines = [line for line in output.splitlines() if line.startswith(f"simulate:tiny-{soc}: ")]
        assert len(lines) == 1, output
        assert f"lost the Dask scheduler at {cluster['address']}" in lines[0] and "(fix: restart `dask scheduler`" in lines[0]
    assert took < 30, took  # the second target fails at once, without waiting for a reconnect
    simulated = records_of(project, "simulate")
    assert {task: r["status"] for task, r in simulated.items()} == {
        "simulate:tiny-SM8650": "failed", "simulate:tiny-SM8750": "failed"}  # failed, not pending
    report = json.loads(project.path("build/report/report.json").read_text())
    assert report["summary"]["failed"] == 2 and report["summary"]["passed"] == 0, report["summary"]


def test_a_killed_workers_scratch_folder_is_swept_by_the_next_worker(tmp_path):
    cluster = start_cluster(tmp_path)
    try:
        wait_for_workers(cluster)
        project = tiny_project(tmp_path / "project", samples=100)
        run = Running(project, "simulate", env=dask_env(tmp_path, cluster["address"]))
        run.wait_for(".  simulate:tiny-SM8650", timeout=600)
        wait_for_call(cluster["worker"], run)
        found = list((tmp_path / "dask-worker").rglob("qnn-dask-*"))
        assert found, "the call's scratch folder is not in the worker's Dask folder"
        stop(cluster["worker"], signal.SIGKILL)  # the worker and its nanny, mid-call
        run.proc.send_signal(signal.SIGINT)
        run.finish()
        assert all(path.is_dir() for path in found)  # what a killed worker leaves behind ...
        cluster["worker"] = start_worker(tmp_path, cluster["address"], cluster["env"], "worker-2")
        wait_for_workers(cluster)
        assert not any(path.exists() for path in found), found  # ... the next worker on that folder removes
    finally:
        stop_cluster(cluster)


def test_an_unreachable_scheduler_costs_its_timeout_once_per_run(tmp_path):
    project = tiny_project(tmp_path / "project", socs=("SM8650", "SM8750"))
    project.doit("config", "cpucheck", check=True)  # the light and local stages: only the remote calls are timed
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    timeout = 5  # Dask's own setting, which the executor follows (the default, 20 s, is only waited out idly)
    result = project.doit("context", env={**dask_env(tmp_path, address),
                                          "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": f"{timeout}s"})
    assert result.returncode != 0
    for soc in ("SM8650", "SM8750"):
        line = result.failure_line(f"context:tiny-{soc}")
        assert f"cannot reach the Dask scheduler at {address}" in line and "(fix: " in line, line
    seconds = sorted(r["seconds"] for r in records_of(project, "context").values())
    assert len(seconds) == 2 and seconds[0] < 2 and timeout - 1 <= seconds[1] < CONNECT_TIMEOUT_S, seconds  # paid once


def test_the_connect_timeout_is_dasks_own_setting():
    import dask.config

    assert connect_timeout_s() == CONNECT_TIMEOUT_S == 20  # Dask's shipped default (30 s) is not a user's choice
    with dask.config.set({"distributed.comm.timeouts.connect": "7s"}):
        assert connect_timeout_s() == 7.0
    with dask.config.set({"distributed.comm.timeouts.connect": 2}):
        assert connect_timeout_s() == 2.0


# ------------------------------------------------------------------ TLS: only certificate holders run code

def make_certs(dest: Path) -> Path:
    """cluster/tls/make-certs.sh for 127.0.0.1; returns the Dask config folder it wrote."""
    subprocess.run(["bash", str(CLUSTER / "tls" / "make-certs.sh"), str(dest), "127.0.0.1"], check=True,
                   capture_output=True, text=True)
    return dest / "config"


def listening(proc: subprocess.Popen) -> set[str]:
    """The IP addresses every listening socket of the process and its descendants is bound to."""
    found = set()
    root = psutil.Process(proc.pid)
    for p in [root] + root.children(recursive=True):
        for conn in p.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                found.add(conn.laddr.ip)
    return found


def test_tls_cluster_runs_a_stage_call_binds_to_its_interface_and_refuses_strangers(tmp_path):
    from distributed import Client
    from distributed.security import Security

    config = make_certs(tmp_path / "certs")
    stranger = make_certs(tmp_path / "stranger-certs")  # a CA and certificates the cluster never saw
    certs = tmp_path / "certs"
    ours = Security(tls_ca_file=str(certs / "ca.pem"), tls_client_cert=str(certs / "client.pem"), require_encryption=True)
    cluster = start_cluster(tmp_path, config, protocol="tls")
    try:
        wait_for_workers(cluster, security=ours)
        assert cluster["address"].startswith("tls://127.0.0.1:")
        for name in ("scheduler", "worker"):  # every port (scheduler, nanny, worker, their http servers)
            assert listening(cluster[name]) == {"127.0.0.1"}, (name, listening(cluster[name]))

        project = tiny_project(tmp_path / "project")
        env = {"QNN_EXECUTOR": cluster["address"], "QNN_CACHE": str(tmp_path / "store"), "DASK_CONFIG": str(config)}
        built = project.doit("context", env=env)
        assert built.returncode == 0, built.stdout + built.stderr
        record = records_of(project, "context")["context:tiny-SM8650"]
        assert record["status"] == "passed" and record["executor"]["kind"] == "dask", record
        assert record["executor"]["worker"].startswith("tls://127.0.0.1:"), record["executor"]

        # clients without a certificate of this cluster's CA are refused, before any code runs
        for name, security in [("another CA", Security(tls_ca_file=str(stranger.parent / "ca.pem"),
                                                       tls_client_cert=str(stranger.parent / "client.pem"),
                                                       require_encryption=True)),
                               ("our CA, a foreign certificate", Security(tls_ca_file=str(certs / "ca.pem"),
                                                                          tls_client_cert=str(stranger.parent / "client.pem"),
                                                                          require_encryption=True))]:
            with pytest.raises(OSError):
                Client(cluster["address"], timeout=5, security=security, set_as_default=False)
        import socket
        import ssl

        no_cert = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        no_cert.check_hostname = False
        with socket.create_connection(("127.0.0.1", cluster["port"]), timeout=5) as raw:
            with pytest.raises((ssl.SSLError, OSError)):
                with no_cert.wrap_socket(raw) as tls:  # a TLS client that shows no certificate at all
                    tls.sendall(b"\0" * 8)
                    assert tls.recv(8) == b""
                    raise OSError("closed by the scheduler")
        with pytest.raises(OSError):
            Client(cluster["address"].replace("tls://", "tcp://"), timeout=5, set_as_default=False,
                   security=Security(require_encryption=False))  # plain tcp to a TLS scheduler

        project.doit("forget", "context:tiny-SM8650", check=True)
        for config_dir, expected in [(CLUSTER, "a tls:// scheduler needs the cluster's CA and this client's certificate"),
                                     (stranger, f"cannot reach the Dask scheduler at {cluster['address']}")]:
            refused = project.doit("context", env={**env, "DASK_CONFIG": str(config_dir),
                                                   "QNN_CACHE": str(tmp_path / "empty-store")})  # no hit: a call
            line = refused.failure_line("context:tiny-SM8650")  # one line, no traceback
            assert expected in line and "(fix: " in line, line
    finally:
        stop_cluster(cluster)
