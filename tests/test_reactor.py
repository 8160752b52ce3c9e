"""The router's reactor (``router/reactor.py``) in a process of its own: a ``stop()`` asked
while a socket event is handled ends the loop at once, with no timer pending to wake it
(its loop skips Twisted's timer pass when nothing is due, and that pass carries out a stop)."""

from __future__ import annotations

import subprocess
import sys

from tests.harness import ROOT

STOPPED_FROM_A_READ = """
import socket
from router import reactor as router_reactor
router_reactor.install()
from twisted.internet import reactor

ours, theirs = socket.socketpair()

class Reader:
    def fileno(self):
        return ours.fileno()

    def doRead(self):
        ours.recv(16)
        reactor.removeReader(self)
        reactor.stop()

    def logPrefix(self):
        return "Reader"

    def connectionLost(self, reason):
        pass

reactor.addReader(Reader())
reactor.callWhenRunning(theirs.send, b"x")
reactor.run(installSignalHandlers=False)
print("stopped")
"""


def test_a_stop_asked_from_a_socket_event_ends_the_loop():
    done = subprocess.run([sys.executable, "-c", STOPPED_FROM_A_READ], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr
