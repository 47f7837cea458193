"""Official Python SDK (azure-servicebus) over TLS to the emulator's TLS listener, trusting the
CA the emulator generated: sends and receives one message with `amqps`, then one with AMQP over
secure WebSockets. Exits non-zero on any mismatch.

Usage: python_tls.py TLS_CONNECTION_STRING CA_PEM QUEUE.

The SDK connects to 5671 (443 over WebSockets) whatever port the connection string's `Endpoint`
names; the supported way to reach another port is `custom_endpoint_address` (azure-servicebus
`_common/_configuration.py`: its host and port become the connection's, the namespace stays the
token audience; without `transport_type` it also switches to WebSockets, so both are given).
`connection_verify` is the CA bundle the SDK's TLS trusts (`_servicebus_client.py`:
`ssl_opts = {"ca_certs": connection_verify or certifi.where()}`, loaded by
`_pyamqp/_transport.py` with `load_verify_locations`). Without `UseDevelopmentEmulator` both
transports use TLS (`amqps://`, `wss://`)."""
import sys
from urllib.parse import urlparse

from azure.servicebus import ServiceBusClient, ServiceBusMessage, TransportType

cs, ca, queue = sys.argv[1], sys.argv[2], sys.argv[3]
endpoint = next(p.split("=", 1)[1] for p in cs.split(";") if p.startswith("Endpoint="))
address = "sb://" + urlparse(endpoint).netloc
for name, transport in [("amqps", TransportType.Amqp), ("wss", TransportType.AmqpOverWebsocket)]:
    with ServiceBusClient.from_connection_string(
        cs,
        retry_total=0,
        transport_type=transport,
        custom_endpoint_address=address,
        connection_verify=ca,
    ) as client:
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage(name, message_id="python-" + name))
        with client.get_queue_receiver(queue, max_wait_time=5) as receiver:
            msgs = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            got = [(m.message_id, str(m)) for m in msgs]
            assert got == [("python-" + name, name)], (name, got)
            receiver.complete_message(msgs[0])
    print("python sdk tls: ok (" + name + ")")
