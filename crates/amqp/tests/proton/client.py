#!/usr/bin/env python3
"""Qpid Proton client for sb-amqp interop tests.

Usage: client.py URL COUNT
Sends COUNT messages to address "proton-q", waits for each to be accepted, then receives
COUNT messages from the same address and accepts them. Prints "OK <sent> <received>" and exits
0 when the bodies come back intact.
"""
import sys

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Client(MessagingHandler):
    def __init__(self, url, count):
        super().__init__(prefetch=0)
        self.url = url
        self.count = count
        self.sent = 0
        self.accepted = 0
        self.received = []
        self.ok = False

    def on_start(self, event):
        conn = event.container.connect(self.url, idle_timeout=2)
        self.sender = event.container.create_sender(conn, "proton-q")

    def on_sendable(self, event):
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body="m%d" % self.sent, id=self.sent))
            self.sent += 1

    def on_accepted(self, event):
        self.accepted += 1
        if self.accepted == self.count:
            self.receiver = event.container.create_receiver(event.connection, "proton-q")
            self.receiver.flow(self.count)

    def on_message(self, event):
        self.received.append(event.message.body)
        if len(self.received) == self.count:
            self.ok = self.received == ["m%d" % i for i in range(self.count)]
            event.connection.close()


if __name__ == "__main__":
    c = Client(sys.argv[1], int(sys.argv[2]))
    Container(c).run()
    print("OK" if c.ok else "FAIL", c.accepted, c.received, flush=True)
    sys.exit(0 if c.ok else 1)
