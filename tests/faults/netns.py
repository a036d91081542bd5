"""Hosts on a network, on one machine: each host a network namespace with one interface on a
bridge (itself in a namespace of its own), addresses from 198.18.0.0/15 (RFC 2544's range for
network tests, so no real network is ever named). This process reaches the hosts through one
more veth from the root namespace.

Faults act on one host's link to one peer, in that host's namespace (iptables), so the rest of
its traffic flows on:
- cut(host, peer): every packet between them dropped silently, as a dead switch port or a
  partition does (no reset, no ICMP: the sockets find out only by timing out);
- degrade(host, peer, delay, jitter, loss): latency (tests/faults/nfdelay.py, since these kernels
  lack sch_netem) and random loss (iptables statistic) on the link, both ways.

Needs root, iproute2 and iptables.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sh(*argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    ns: str
    addr: str
    queues: dict = field(default_factory=dict)  # peer address -> (queue number, nfdelay process)

    def exec_prefix(self) -> list:
        return ["ip", "netns", "exec", self.ns]

    def run(self, *argv, check=True):
        return sh(*self.exec_prefix(), *argv, check=check)


class Network:
    def __init__(self, tag: str | None = None):
        if os.geteuid() != 0:
            raise RuntimeError("network namespaces need root")
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is missing: apt-get install iproute2 iptables")
        n = os.getpid() % 500
        self.tag = tag or f"sf{n}"
        # One /24 per run (by pid) inside 198.18.0.0/15, so two runs side by side do not collide.
        self.prefix = f"198.{18 + n // 250}.{n % 250}"
        self.switch = f"{self.tag}-sw"
        self.harness_if = f"{self.tag}h"
        self.harness_addr = f"{self.prefix}.1"
        self.hosts: dict[str, Host] = {}
        self._next = 2
        self._queue = 0
        self.up = False

    def start(self) -> "Network":
        self.teardown()  # a previous run with the same pid that died before tearing down
        sh("ip", "netns", "add", self.switch)
        self.up = True
        self._in(self.switch, "ip", "link", "set", "lo", "up")
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")
        sh("ip", "link", "add", self.harness_if, "type", "veth", "peer", "name", "harness", "netns", self.switch)
        self._in(self.switch, "ip", "link", "set", "harness", "master", "br0", "up")
        sh("ip", "addr", "add", f"{self.harness_addr}/24", "dev", self.harness_if)
        sh("ip", "link", "set", self.harness_if, "up")
        return self

    def _in(self, ns, *argv):
        return sh("ip", "netns", "exec", ns, *argv)

    def add_host(self, name: str) -> Host:
        host = Host(name, f"{self.tag}-{name}", f"{self.prefix}.{self._next}")
        self._next += 1
        sh("ip", "netns", "add", host.ns)
        sh("ip", "link", "add", f"p-{name}"[:15], "netns", self.switch, "type", "veth", "peer", "name", "eth0",
           "netns", host.ns)
        self._in(self.switch, "ip", "link", "set", f"p-{name}"[:15], "master", "br0", "up")
        host.run("ip", "addr", "add", f"{host.addr}/24", "dev", "eth0")
        host.run("ip", "link", "set", "eth0", "up")
        host.run("ip", "link", "set", "lo", "up")
        self.hosts[name] = host
        return host

    # -- faults -----------------------------------------------------------------------------

    def cut(self, host: Host, peer: Host) -> None:
        host.run("iptables", "-I", "OUTPUT", "-d", peer.addr, "-j", "DROP")
        host.run("iptables", "-I", "INPUT", "-s", peer.addr, "-j", "DROP")

    def heal(self, host: Host, peer: Host) -> None:
        host.run("iptables", "-D", "OUTPUT", "-d", peer.addr, "-j", "DROP", check=False)
        host.run("iptables", "-D", "INPUT", "-s", peer.addr, "-j", "DROP", check=False)

    def degrade(self, host: Host, peer: Host, *, delay_ms: float, jitter_ms: float = 0.0, loss: float = 0.0,
                log: Path | None = None) -> None:
        """Latency on packets to the peer (one way: the round trip grows by `delay_ms`), loss
        on both ways."""
        if loss:
            for chain, flag in (("OUTPUT", "-d"), ("INPUT", "-s")):
                host.run("iptables", "-A", chain, flag, peer.addr, "-m", "statistic", "--mode", "random",
                         "--probability", f"{loss:.4f}", "-j", "DROP")
        if delay_ms:
            number = self._queue
            self._queue += 1
            out = open(log, "ab") if log else subprocess.DEVNULL
            proc = subprocess.Popen(
                [*host.exec_prefix(), sys.executable, "-m", "tests.faults.nfdelay", "--queue", str(number),
                 "--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )
            if log:
                out.close()
            host.queues[peer.addr] = (number, proc)
            # Queue only once the delayer holds it (bypass would let packets through meanwhile,
            # which is harmless, but the figure should mean what it says).
            import time

            time.sleep(0.3)
            host.run("iptables", "-A", "OUTPUT", "-d", peer.addr, "-j", "NFQUEUE", "--queue-num", str(number),
                     "--queue-bypass")

    def restore(self, host: Host, peer: Host) -> None:
        """Undo degrade() on that link."""
        for chain in ("OUTPUT", "INPUT"):
            rules = host.run("iptables", "-S", chain).stdout.splitlines()
            for rule in rules:
                if peer.addr in rule and ("statistic" in rule or "NFQUEUE" in rule):
                    host.run("iptables", *rule.replace("-A", "-D", 1).split())
        number, proc = host.queues.pop(peer.addr, (None, None))
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()

    def teardown(self) -> None:
        for host in self.hosts.values():
            for _, proc in host.queues.values():
                proc.kill()
        listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
        for line in listed:
            name = line.split(" ")[0]
            if name.startswith(f"{self.tag}-"):
                # Kill what still runs inside before the namespace goes.
                pids = sh("ip", "netns", "pids", name, check=False).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except (ProcessLookupError, ValueError):
                        pass
                sh("ip", "netns", "del", name, check=False)
        sh("ip", "link", "del", self.harness_if, check=False)
        self.up = False
