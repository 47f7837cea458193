// Official JavaScript SDK (@azure/service-bus, pinned in package.json) against the emulator:
// send, receive, complete, abandon, dead-letter with reason, DLQ read-back, renew.
// Usage: node smoke.mjs CONNECTION_STRING (queue "orders"). Exits non-zero on any mismatch.
import assert from "node:assert/strict";
import { ServiceBusClient } from "@azure/service-bus";

const client = new ServiceBusClient(process.argv[2], { retryOptions: { maxRetries: 0 } });
const queue = "orders";

async function receiveAll(receiver, count) {
  const out = [];
  const deadline = Date.now() + 10000;
  while (out.length < count && Date.now() < deadline) {
    out.push(...(await receiver.receiveMessages(count - out.length, { maxWaitTimeInMs: 2000 })));
  }
  return out;
}

try {
  const sender = client.createSender(queue);
  await sender.sendMessages({ body: "hello", messageId: "js-1", subject: "orders.order-placed.v1" });
  await sender.sendMessages([{ body: "a" }, { body: "b" }]);
  const batch = await sender.createMessageBatch();
  assert.ok(batch.tryAddMessage({ body: "c" }));
  await sender.sendMessages(batch);
  await sender.close();

  const receiver = client.createReceiver(queue);
  const msgs = await receiveAll(receiver, 4);
  assert.deepEqual(msgs.map((m) => m.body), ["hello", "a", "b", "c"]);
  assert.deepEqual(msgs.map((m) => m.deliveryCount), [0, 0, 0, 0]);
  assert.equal(msgs[0].messageId, "js-1");
  assert.equal(msgs[0].subject, "orders.order-placed.v1");
  assert.match(msgs[0].lockToken, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
  const seqs = msgs.map((m) => m.sequenceNumber.toNumber());
  assert.deepEqual([...seqs].sort((x, y) => x - y), seqs);
  const before = msgs[0].lockedUntilUtc.getTime();
  const renewed = await receiver.renewMessageLock(msgs[0]);
  assert.ok(renewed.getTime() >= before, `${renewed} >= ${before}`);
  await receiver.completeMessage(msgs[0]);
  await receiver.abandonMessage(msgs[1]);
  await receiver.deadLetterMessage(msgs[2], {
    deadLetterReason: "Poison",
    deadLetterErrorDescription: "bad payload",
  });
  await receiver.completeMessage(msgs[3]);
  const again = await receiveAll(receiver, 1);
  assert.deepEqual(again.map((m) => [m.body, m.deliveryCount]), [["a", 1]]);
  await receiver.completeMessage(again[0]);
  await receiver.close();

  const dlq = client.createReceiver(queue, { subQueueType: "deadLetter" });
  const dead = await receiveAll(dlq, 1);
  assert.deepEqual(
    dead.map((m) => [m.body, m.deadLetterReason, m.deadLetterErrorDescription]),
    [["b", "Poison", "bad payload"]],
  );
  await dlq.completeMessage(dead[0]);
  await dlq.close();
  console.log("js sdk: ok");
} finally {
  await client.close();
}
