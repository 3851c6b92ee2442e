"""Two "hosts" on one machine for the multi-node tests: network namespaces joined by a veth pair."""

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@contextlib.contextmanager
def two_hosts(prefix: str = "gf15", subnet: int = 231):
    """Two network namespaces joined by a veth pair (10.SUBNET.0.1 <-> 10.SUBNET.0.2), removed after.

    Skips the calling test with the reason when namespaces are refused."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed: cannot build network namespaces")
    tag = f"{os.getpid() % 100000}"
    names = [f"{prefix}a{tag}", f"{prefix}b{tag}"]
    ifs = [f"{prefix[:2]}{prefix[-1]}a{tag}", f"{prefix[:2]}{prefix[-1]}b{tag}"]
    made = []
    try:
        for ns in names:
            r = _ip("netns", "add", ns)
            if r.returncode:
                pytest.skip(f"network namespaces refused here (`ip netns add` said: {r.stderr.strip()})")
            made.append(ns)
        steps = [
            ("link", "add", ifs[0], "type", "veth", "peer", "name", ifs[1]),
            ("link", "set", ifs[0], "netns", names[0]),
            ("link", "set", ifs[1], "netns", names[1]),
        ]
        for i, ns in enumerate(names):
            steps += [
                ("-n", ns, "addr", "add", f"10.{subnet}.0.{i + 1}/24", "dev", ifs[i]),
                ("-n", ns, "link", "set", ifs[i], "up"),
                ("-n", ns, "link", "set", "lo", "up"),
            ]
        for step in steps:
            r = _ip(*step)
            assert r.returncode == 0, f"ip {' '.join(step)}: {r.stderr}"
        yield [(names[i], f"10.{subnet}.0.{i + 1}", ifs[i]) for i in range(2)]
    finally:
        for ns in made:
            _ip("netns", "del", ns)  # removes the veth pair with it


def skip_without_mount_namespaces(ns: str) -> None:
    """Skip the calling test when a private /dev/shm cannot be mounted in namespace `ns` (two DGL
    "machines" on one host need one each: DGL names its shared memory after the graph)."""
    probe = subprocess.run(
        ["ip", "netns", "exec", ns, "unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        pytest.skip(f"mount namespaces refused here (`unshare -m` + tmpfs said: {probe.stderr.strip()})")


def in_namespace(host: tuple[str, str, str], script: str) -> list[str]:
    """The command running the sh `script` on `host` (a `two_hosts` entry): in its namespace, with a
    private /dev/shm, gloo on its veth interface."""
    ns, _addr, ifname = host
    setup = f"mount -t tmpfs tmpfs /dev/shm || exit 97\nexport GLOO_SOCKET_IFNAME={ifname}\n"
    return ["ip", "netns", "exec", ns, "unshare", "-m", "sh", "-c", setup + script]


def machine_script(args: list[str], log_dir: Path, i: int) -> str:
    """One DistDGL machine: a private /dev/shm, then its server in the background and its trainer."""
    common = " ".join(shlex.quote(a) for a in args)
    py = shlex.quote(sys.executable)
    server_log, trainer_log = (shlex.quote(str(log_dir / f"{r}{i}.log")) for r in ("server", "trainer"))
    return (
        "mount -t tmpfs tmpfs /dev/shm || exit 97\n"
        f"{py} -m training.distdgl server {common} > {server_log} 2>&1 &\n"
        "server=$!\n"
        f"{py} -m training.distdgl trainer {common} > {trainer_log} 2>&1\n"
        "rc=$?\n"
        "wait $server\n"
        "src=$?\n"
        '[ "$rc" -eq 0 ] && exit "$src"\n'
        'exit "$rc"\n'
    )


def run_distdgl_machines(hosts, args: list[str], log_dir: Path, timeout: float = 240) -> None:
    """Run one DistDGL server and one trainer (`training.distdgl`) per host of `two_hosts` with the
    same flags; fails with the logs when a machine fails (the other is then stopped, not left
    waiting for its peer). Each machine's GLOO_SOCKET_IFNAME is its veth end."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch", "PYTHONPATH": str(ROOT)}
    ip = log_dir / "ip.txt"
    ip.write_text("".join(f"{addr} 30150\n" for _, addr, _ in hosts))
    procs = []
    for i, (ns, _addr, ifname) in enumerate(hosts):
        script = machine_script(["--machine", str(i), "--ip-config", str(ip), *args], log_dir, i)
        cmd = ["ip", "netns", "exec", ns, "unshare", "-m", "sh", "-c", script]
        machine_env = {**env, "GLOO_SOCKET_IFNAME": ifname}
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=machine_env, start_new_session=True))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() for p in procs):  # one machine failed: its peer would wait for it
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # the machine's server and trainer too
                p.wait()
    logs = {f.name: f.read_text()[-2500:] for f in sorted(log_dir.glob("*.log"))}
    assert [p.returncode for p in procs] == [0, 0], logs
