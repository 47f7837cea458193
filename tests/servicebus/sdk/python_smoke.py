"""Official Python SDK (azure-servicebus) against the emulator: send, batch, receive, renew,
complete, abandon, dead-letter, DLQ read-back, unknown entity. Exits non-zero on any mismatch.

Usage: python_smoke.py CONNECTION_STRING [WEBSOCKET_HOST:PORT]. With the second argument the SDK
speaks AMQP over WebSockets (`TransportType.AmqpOverWebsocket`, which needs the
`websocket-client` package) to that endpoint: `custom_endpoint_address` points it at the
emulator's WebSocket port, and `UseDevelopmentEmulator=true` makes it plain `ws://` (the SDK
then builds `ws://HOST:PORT/$servicebus/websocket` with subprotocol `AMQPWSB10`)."""
import sys

from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType
from azure.servicebus.exceptions import MessagingEntityNotFoundError, ServiceBusError

cs = sys.argv[1]
options = {}
if len(sys.argv) > 2:
    options = {
        "transport_type": TransportType.AmqpOverWebsocket,
        "custom_endpoint_address": "sb://" + sys.argv[2],
    }
with ServiceBusClient.from_connection_string(cs, retry_total=0, **options) as client:
    with client.get_queue_sender("orders") as sender:
        sender.send_messages(ServiceBusMessage("hello", message_id="m-1", subject="orders.order-placed.v1"))
        sender.send_messages([ServiceBusMessage("a"), ServiceBusMessage("b")])
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage("c"))
        sender.send_messages(batch)
    with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
        msgs = receiver.receive_messages(max_message_count=4, max_wait_time=5)
        assert [str(m) for m in msgs] == ["hello", "a", "b", "c"], [str(m) for m in msgs]
        assert [m.delivery_count for m in msgs] == [0, 0, 0, 0], [m.delivery_count for m in msgs]
        seqs = [m.sequence_number for m in msgs]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4, seqs
        assert msgs[0].message_id == "m-1" and msgs[0].subject == "orders.order-placed.v1"
        before = msgs[0].locked_until_utc
        receiver.renew_message_lock(msgs[0])
        assert msgs[0].locked_until_utc >= before
        receiver.complete_message(msgs[0])
        receiver.abandon_message(msgs[1])
        receiver.dead_letter_message(msgs[2], reason="Poison", error_description="bad payload")
        receiver.complete_message(msgs[3])
    with client.get_queue_receiver("orders", max_wait_time=5) as receiver:
        msgs = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert [(str(m), m.delivery_count) for m in msgs] == [("a", 1)], [(str(m), m.delivery_count) for m in msgs]
        receiver.complete_message(msgs[0])
    with client.get_queue_receiver("orders", sub_queue="deadletter", max_wait_time=5) as receiver:
        msgs = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        got = [(str(m), m.dead_letter_reason, m.dead_letter_error_description) for m in msgs]
        assert got == [("b", "Poison", "bad payload")], got
        receiver.complete_message(msgs[0])
    try:
        with client.get_queue_sender("nope") as sender:
            sender.send_messages(ServiceBusMessage("x"))
        raise AssertionError("sending to an unknown queue must fail")
    except (MessagingEntityNotFoundError, ServiceBusError) as error:
        assert "not-found" in str(error) or isinstance(error, MessagingEntityNotFoundError), error
print("python sdk: ok" + (" (websockets)" if options else ""))
