"""tests/e2e/redis_util.py: a redis-server of the test's own (the shared KV tier's store) on a free loopback port."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile

import e2e_util as u


class Redis:
    """A redis-server of its own on a free loopback port, in a temp dir, without persistence; kill() ends it."""

    def __init__(self, args=()):
        self.bin = shutil.which("redis-server")
        self.cli = shutil.which("redis-cli")
        self.dir = tempfile.mkdtemp(prefix="dserve-redis-")
        self.port = u.free_ports(1)[0]
        self.args = list(args)
        self.log = open(os.path.join(self.dir, "redis.log"), "ab")
        self.proc = None
        self.start()

    def start(self):
        """Starts the server (again, after kill(): on the same port, loading the dir's dump.rdb if SAVE made one)."""
        self.proc = subprocess.Popen([self.bin, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir, "--maxmemory-policy", "allkeys-lru"]
                                     + self.args, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if not u.wait_until(self.ping, 10 * u.SCALE, 0.05):
            raise AssertionError("redis-server did not answer on port %d" % self.port)

    def ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), 1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up (with requirepass: up and locked)
        except OSError:
            return False

    def run(self, *args):
        return subprocess.run([self.cli, "-p", str(self.port)] + list(args), check=True, capture_output=True,
                              timeout=30).stdout.decode()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def close(self):
        self.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
