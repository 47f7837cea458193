// Issue 33: the JavaScript SDK 7.10 beta's ServiceBusReceiver.deleteMessages / purgeMessages
// (`com.microsoft:batch-delete-messages` on `<entity>/$management`) against the emulator.
//
// Usage: node delete.mjs CONNECTION_STRING QUEUE
// Prints one line per step and `js batch delete: ok`; exits 1 on any mismatch.

import { ServiceBusClient } from "@azure/service-bus";
import assert from "node:assert/strict";

const [connectionString, queue] = process.argv.slice(2);
const client = new ServiceBusClient(connectionString);
const sender = client.createSender(queue);
const receiver = client.createReceiver(queue);

async function send(count, prefix) {
  let batch = await sender.createMessageBatch();
  for (let i = 0; i < count; i++) {
    const message = { body: `${prefix}-${i}`, messageId: `${prefix}-${i}` };
    if (!batch.tryAddMessage(message)) {
      await sender.sendMessages(batch);
      batch = await sender.createMessageBatch();
      assert.ok(batch.tryAddMessage(message));
    }
  }
  await sender.sendMessages(batch);
  // The SDK's default cutoff is `new Date()`, to the millisecond, and only messages enqueued
  // strictly before it are deleted. Against a broker on localhost the last send and the delete
  // can fall in one millisecond, which a broker a network away never sees: step past it.
  const sent = Date.now();
  while (Date.now() <= sent) {
    await new Promise((resolve) => setImmediate(resolve));
  }
}

// deleteMessages deletes at most maxMessageCount, oldest first.
await send(5, "first");
assert.equal(await receiver.deleteMessages({ maxMessageCount: 2 }), 2);
// A fresh receiver peeks from the start (a receiver's peeks go on where its last one ended).
const peek = (count) => client.createReceiver(queue).peekMessages(count);
const left = await peek(10);
assert.deepEqual(left.map((m) => m.messageId), ["first-2", "first-3", "first-4"]);
console.log("deleteMessages maxMessageCount: ok");

// beforeEnqueueTime keeps what was enqueued at or after it.
const cut = left[left.length - 1].enqueuedTimeUtc.getTime() + 1;
while (Date.now() <= cut) {
  // The next messages must be enqueued after `cut` by the broker's clock.
  await new Promise((resolve) => setImmediate(resolve));
}
await send(2, "second");
assert.equal(await receiver.deleteMessages({ maxMessageCount: 100, beforeEnqueueTime: new Date(cut) }), 3);
const kept = await peek(10);
assert.deepEqual(kept.map((m) => m.messageId), ["second-0", "second-1"]);
console.log("deleteMessages beforeEnqueueTime: ok");

// purgeMessages deletes in batches of 500 until fewer come back.
await send(600, "bulk");
assert.equal(await receiver.purgeMessages(), 602);
assert.equal((await peek(1)).length, 0);
assert.equal(await receiver.deleteMessages({ maxMessageCount: 10 }), 0);
console.log("purgeMessages: ok");

await client.close();
console.log("js batch delete: ok");
