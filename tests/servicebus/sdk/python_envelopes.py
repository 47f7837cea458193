"""Foreign envelopes, sent with the official Python SDK (azure-servicebus) for `sb-inbox run` to
consume: each fixture is built from its framework's documented wire format.

Usage: python_envelopes.py CONNECTION_STRING QUEUE SCENARIO [ORDER_ID]

Scenarios (each prints `sent N` with the number of messages sent):
- masstransit: the JSON envelope (application/vnd.masstransit+json) as
  https://masstransit.io/documentation/configuration/serialization shows it, and raw JSON
  (application/json) with the transport headers MassTransit's RawMessageSerializer writes
  (MessageId, ConversationId, MT-MessageType; src/MassTransit/Serialization/RawMessageSerializer.cs,
  names from src/MassTransit.Abstractions/MessageHeaders.cs). Duplicates: the same messageId under
  a new broker message id. One envelope of a type the consumer does not map (dead-lettered).
- nservicebus: native messages as the Azure Service Bus transport sends them: the NServiceBus
  headers as application properties, the serialized message as the body
  (https://docs.particular.net/transports/azure-service-bus/native-integration; header names from
  https://docs.particular.net/nservicebus/messaging/headers). The broker message id is distinct
  from NServiceBus.MessageId, as that page warns: a duplicate comes under a new broker id, and a
  different message reuses an earlier broker id.
- cloudevents: events built with the official CloudEvents SDK (`cloudevents`,
  cloudevents.core.bindings.amqp: to_structured_event / to_binary_event, the CloudEvents AMQP
  protocol binding). The same event (source + id) structured and then binary is one event; the
  same id from another source is another.
- cloudevents-plain-id: two binary events (e-1, e-2) that also carry a plain `id` application
  property of the same value.
- masstransit-one / nservicebus-one ORDER_ID: that one order in that framework's envelope, under
  the framework's own id (mt-ORDER_ID, nsb-ORDER_ID).
"""
import json
import sys
from datetime import datetime, timezone

from azure.servicebus import ServiceBusClient, ServiceBusMessage

MT_TYPE = "urn:message:Shop.Contracts:OrderPlaced"
NSB_TYPES = (
    "Shop.Contracts.OrderPlaced, Shop.Contracts, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null;"
    "Shop.Contracts.IOrderEvent, Shop.Contracts, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"
)
CE_TYPE = "com.example.shop.order.placed"


def order(order_id):
    """The reference contract's payload (orders.order-placed.v1): two units of A."""
    return {"orderId": order_id, "lines": [{"sku": "A", "quantity": 2}]}


def mt_envelope(message_id, broker_id, payload, message_type=MT_TYPE):
    envelope = {
        "messageId": message_id,
        "requestId": None,
        "correlationId": None,
        "conversationId": "conv-" + message_id,
        "initiatorId": None,
        "sourceAddress": "sb://shop.servicebus.windows.net/checkout",
        "destinationAddress": "sb://shop.servicebus.windows.net/Shop.Contracts/OrderPlaced",
        "responseAddress": None,
        "faultAddress": None,
        "messageType": [message_type],
        "message": payload,
        "expirationTime": None,
        "sentTime": "2026-12-04T20:00:00.0000000Z",
        "headers": {"Tenant": "shop"},
        "host": {
            "machineName": "SHOP01",
            "processName": "Shop.Checkout",
            "processId": 4242,
            "assembly": "Shop.Checkout",
            "assemblyVersion": "1.0.0.0",
            "frameworkVersion": "8.0.0",
            "massTransitVersion": "8.2.0.0",
            "operatingSystemVersion": "Unix 6.1.0",
        },
    }
    return ServiceBusMessage(
        json.dumps(envelope),
        message_id=broker_id,
        content_type="application/vnd.masstransit+json",
    )


def mt_raw(message_id, broker_id, payload):
    return ServiceBusMessage(
        json.dumps(payload),
        message_id=broker_id,
        content_type="application/json",
        application_properties={
            "MessageId": message_id,
            "ConversationId": "conv-" + message_id,
            "MT-MessageType": MT_TYPE,
        },
    )


def nsb(message_id, broker_id, payload):
    return ServiceBusMessage(
        json.dumps(payload),
        message_id=broker_id,
        content_type="application/json",
        application_properties={
            "NServiceBus.MessageId": message_id,
            "NServiceBus.EnclosedMessageTypes": NSB_TYPES,
            "NServiceBus.ContentType": "application/json",
            "NServiceBus.MessageIntent": "Publish",
            "NServiceBus.ConversationId": "conv-" + message_id,
            "NServiceBus.CorrelationId": message_id,
            "NServiceBus.OriginatingEndpoint": "Shop.Checkout",
            "NServiceBus.OriginatingMachine": "SHOP01",
            "NServiceBus.TimeSent": "2026-12-04 20:00:00:000000 Z",
            "NServiceBus.Version": "9.2.0",
        },
    )


def cloudevent(mode, source, event_id, broker_id, payload, plain=None):
    from cloudevents.core.bindings import amqp
    from cloudevents.core.v1.event import CloudEvent

    event = CloudEvent(
        attributes={
            "type": CE_TYPE,
            "source": source,
            "id": event_id,
            "datacontenttype": "application/json",
            "subject": payload["orderId"],
        },
        data=payload,
    )
    wire = amqp.to_structured_event(event) if mode == "structured" else amqp.to_binary_event(event)
    # The binding's to_binary writes `time` as "AMQP timestamp type (milliseconds since Unix
    # epoch)" but as a Python int, which azure-servicebus encodes as an AMQP int (32 bits) and
    # refuses; a datetime is what it encodes as the AMQP timestamp the binding means.
    properties = {
        name: datetime.fromtimestamp(value / 1000, tz=timezone.utc)
        if name.endswith("time") and isinstance(value, int)
        else value
        for name, value in wire.application_properties.items()
    }
    # Application properties of the producer's own, beside the binding's cloudEvents_ ones.
    properties.update(plain or {})
    return ServiceBusMessage(
        wire.application_data,
        message_id=broker_id,
        content_type=wire.properties["content-type"],
        application_properties=properties or None,
    )


def scenario(name, order_id):
    if name == "masstransit":
        return [
            mt_envelope("mt-1", "b-1", order("o-1")),
            mt_envelope("mt-1", "b-2", order("o-1")),  # the same message, a new broker id
            mt_envelope("mt-2", "b-3", order("o-2")),
            mt_raw("mt-3", "b-4", order("o-3")),
            mt_raw("mt-3", "b-5", order("o-3")),  # the same raw message, a new broker id
            mt_envelope("mt-4", "b-6", order("o-4"), "urn:message:Billing.Contracts:InvoiceSent"),  # a type the worker does not map
        ]
    if name == "nservicebus":
        return [
            nsb("nsb-1", "b-1", order("o-1")),
            nsb("nsb-1", "b-2", order("o-1")),  # the same message, a new broker id
            nsb("nsb-2", "b-3", order("o-2")),
            nsb("nsb-3", "b-1", order("o-3")),  # another message under an earlier broker id
        ]
    if name == "cloudevents":
        return [
            cloudevent("structured", "/shop/checkout", "e-1", "b-1", order("o-1")),
            cloudevent("binary", "/shop/checkout", "e-1", "b-2", order("o-1")),  # the same event
            cloudevent("binary", "/shop/checkout", "e-2", "b-3", order("o-2")),
            cloudevent("structured", "/shop/returns", "e-1", "b-4", order("o-3")),  # another source
        ]
    if name == "cloudevents-plain-id":
        # Two distinct events that both carry a plain `id` property (the producer's own header,
        # here a shared batch id): the attribute cloudEvents_id keys each, never the plain id.
        return [
            cloudevent("binary", "/shop/checkout", "e-1", "b-1", order("o-1"), {"id": "batch-7"}),
            cloudevent("binary", "/shop/checkout", "e-2", "b-2", order("o-2"), {"id": "batch-7"}),
        ]
    if name == "masstransit-one":
        return [mt_envelope("mt-" + order_id, "b-mt-" + order_id, order(order_id))]
    if name == "nservicebus-one":
        return [nsb("nsb-" + order_id, "b-nsb-" + order_id, order(order_id))]
    raise SystemExit("unknown scenario " + name)


def main():
    connection, queue, name = sys.argv[1:4]
    order_id = sys.argv[4] if len(sys.argv) > 4 else ""
    messages = scenario(name, order_id)
    with ServiceBusClient.from_connection_string(connection, retry_total=0) as client:
        with client.get_queue_sender(queue) as sender:
            # One at a time, in order: the duplicates must arrive after their originals.
            for message in messages:
                sender.send_messages(message)
    print("sent %d" % len(messages))


main()
