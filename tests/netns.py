"""Two "hosts" on one machine for the multi-node tests: network namespaces joined by a veth pair."""

import contextlib
import os
import shutil
import subprocess

import pytest


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
