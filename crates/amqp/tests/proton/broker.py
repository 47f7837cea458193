#!/usr/bin/env python3
"""Minimal Qpid Proton broker for sb-amqp interop tests.

Usage: broker.py HOST:PORT
Prints "LISTENING" once the acceptor is up. Messages sent to an address are queued and
delivered to receivers of the same address. A message whose body is the string "reject-me" is
rejected with amqp:link:message-size-exceeded. Receivers' drain requests are answered.
"""
import collections
import sys

from proton import Condition, Delivery
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Broker(MessagingHandler):
    def __init__(self, url):
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url = url
        self.queues = collections.defaultdict(collections.deque)
        self.consumers = collections.defaultdict(list)

    def on_start(self, event):
        event.container.listen(self.url)
        print("LISTENING", flush=True)

    def on_link_opening(self, event):
        link = event.link
        if link.is_sender:
            address = link.remote_source.address
            link.source.address = address
            self.consumers[address].append(link)
        else:
            link.target.address = link.remote_target.address
            link.flow(100)

    def on_link_closing(self, event):
        if event.link.is_sender:
            address = event.link.source.address
            if event.link in self.consumers[address]:
                self.consumers[address].remove(event.link)

    def dispatch(self, link):
        queue = self.queues[link.source.address]
        while link.credit > 0 and queue:
            link.send(queue.popleft())
        if link.drain_mode:
            link.drained()

    def on_link_flow(self, event):
        if event.link.is_sender:
            self.dispatch(event.link)

    def on_message(self, event):
        delivery = event.delivery
        if event.message.body == "reject-me":
            delivery.local.condition = Condition(
                "amqp:link:message-size-exceeded", "rejected by the proton broker"
            )
            delivery.update(Delivery.REJECTED)
            delivery.settle()
        else:
            address = event.link.target.address
            self.queues[address].append(event.message)
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
            for link in self.consumers[address]:
                self.dispatch(link)
        event.link.flow(1)


if __name__ == "__main__":
    Container(Broker(sys.argv[1])).run()
