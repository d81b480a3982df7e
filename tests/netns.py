"""netns.py - emulated nodes for the Python multi-node tests, as
tests/netns_lib.sh is for the shell ones: network namespaces on a bridge in
a namespace of its own, created by up() and removed by down(). Imported from
the tests' folder (Python puts a script's own directory first on its path).
Traffic never leaves these namespaces."""
import os
import signal
import subprocess


class Netns:
    """N network namespaces on a bridge in a namespace of its own (as
    tests/netns_lib.sh does): node i has <subnet>.<i+1> (10.202.0 unless
    given) and the name node<i> in every node's hosts file. Nothing leaves them; down() ends what runs in
    them by PID and removes them."""

    def __init__(self, n, subnet="10.202.0"):
        tag = os.getpid()
        self.subnet = subnet
        self.br = "cm%dbr" % tag
        self.nodes = ["cm%dn%d" % (tag, i) for i in range(n)]
        self.veths = [("cme%d-%d" % (i, tag), "cmb%d-%d" % (i, tag)) for i in range(n)]

    def addr(self, i):
        return "%s.%d" % (self.subnet, i + 1)

    def ip(self, *args):
        subprocess.run(["ip", *args], check=True, timeout=30)

    def up(self):
        self.ip("netns", "add", self.br)
        self.ip("-n", self.br, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.br, "link", "set", "br0", "up")
        for i, ns in enumerate(self.nodes):
            eth, port = self.veths[i]
            self.ip("netns", "add", ns)
            self.ip("link", "add", eth, "type", "veth", "peer", "name", port)
            self.ip("link", "set", eth, "netns", ns)
            self.ip("link", "set", port, "netns", self.br)
            self.ip("-n", ns, "link", "set", eth, "name", "eth0")
            self.ip("-n", ns, "addr", "add", self.addr(i) + "/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", self.br, "link", "set", port, "master", "br0")
            self.ip("-n", self.br, "link", "set", port, "up")
            os.makedirs("/etc/netns/" + ns, exist_ok=True)
            with open("/etc/netns/%s/hosts" % ns, "w") as f:
                f.write("127.0.0.1 localhost\n")
                for k in range(len(self.nodes)):
                    f.write("%s node%d\n" % (self.addr(k), k))

    def add_hosts(self, names):
        """Adds "address name..." lines to every node's hosts file: names[i]
        are node i's names (what cluster DNS would answer)."""
        for ns in self.nodes:
            with open("/etc/netns/%s/hosts" % ns, "a") as f:
                for i, own in enumerate(names):
                    f.write("%s %s\n" % (self.addr(i), " ".join(own)))

    def exec(self, i):
        """The argv prefix that runs a command in node i."""
        return ["ip", "netns", "exec", self.nodes[i]]

    def down(self):
        for ns in self.nodes:
            p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in p.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["rm", "-rf", "/etc/netns/" + ns])
        subprocess.run(["ip", "netns", "del", self.br], capture_output=True)
