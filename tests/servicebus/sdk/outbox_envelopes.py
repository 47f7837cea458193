"""Reads what sb-inbox's outbox relay sent to a queue with independent implementations.

The official Python Service Bus SDK (azure-servicebus) receives and completes EXPECTED messages
from QUEUE; the official CloudEvents Python SDK (cloudevents 2.x, its AMQP protocol binding:
`cloudevents.core.bindings.amqp.from_amqp`, which picks structured or binary mode from the
content type as the binding's section 3 says) parses every message that is a CloudEvent. Prints
one JSON document: a list with, per message, its AMQP fields, application properties and body
as received, and the attributes and data the CloudEvents SDK read.

Usage: outbox_envelopes.py CONNECTION_STRING QUEUE EXPECTED
"""

import json
import sys

from azure.servicebus import ServiceBusClient
from cloudevents.core.bindings.amqp import AMQPMessage, from_amqp
from cloudevents.core.formats.json import JSONFormat


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def cloudevent(message, properties, body):
    """The CloudEvents SDK's reading of a Service Bus message, or None for one that is not a
    CloudEvent (neither the structured media type nor binary-mode attributes)."""
    content_type = message.content_type or ""
    structured = content_type.startswith("application/cloudevents")
    binary = any(name.startswith(("cloudEvents:", "cloudEvents_")) for name in properties)
    if not (structured or binary):
        return None
    event = from_amqp(
        AMQPMessage(
            properties={"content-type": content_type},
            application_properties=properties,
            application_data=body,
        ),
        JSONFormat(),
    )
    time = event.get_time()
    return {
        "specversion": event.get_specversion(),
        "id": event.get_id(),
        "source": event.get_source(),
        "type": event.get_type(),
        "subject": event.get_subject(),
        "time": time.isoformat() if time else None,
        "datacontenttype": event.get_datacontenttype(),
        "tenant": event.get_extension("tenant"),
        "data": event.get_data(),
    }


def main():
    connection, queue, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
    received = []
    with ServiceBusClient.from_connection_string(connection) as client:
        with client.get_queue_receiver(queue, max_wait_time=10) as receiver:
            while len(received) < expected:
                batch = receiver.receive_messages(
                    max_message_count=expected - len(received), max_wait_time=10
                )
                if not batch:
                    break
                for message in batch:
                    receiver.complete_message(message)
                    received.append(message)
    records = []
    for message in received:
        properties = {
            text(name): text(value)
            for name, value in (message.application_properties or {}).items()
        }
        body = b"".join(message.body)
        records.append(
            {
                "message_id": message.message_id,
                "content_type": message.content_type,
                "correlation_id": message.correlation_id,
                "subject": message.subject,
                "properties": properties,
                "body": body.decode(),
                "cloudevent": cloudevent(message, properties, body),
            }
        )
    print(json.dumps(records))


if __name__ == "__main__":
    main()
