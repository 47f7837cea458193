// Official JavaScript SDK (@azure/service-bus, pinned in package.json) against the emulator: the
// flows of the SDK's own v7 samples (its npm package ships none), each from a fresh client so
// that the first link of the connection is the entity's `$management` node where the flow
// starts there (issue 21): peek, schedule + cancel, the rule manager round trip, deferral, and
// dead-letter + resubmit.
// Usage: node management.mjs CONNECTION_STRING (queue "mgmt-q", topic "mgmt-t" with
// subscription "mgmt-s"). Prints `step NAME: ok` per step and `js management: ok` at the end;
// exits non-zero on any mismatch.
import assert from "node:assert/strict";
import { ServiceBusClient } from "@azure/service-bus";

const connectionString = process.argv[2];
const queue = "mgmt-q";
const topic = "mgmt-t";
const subscription = "mgmt-s";
// No retries: a refused token or an unknown operation must fail the step, not spin.
const fresh = () => new ServiceBusClient(connectionString, { retryOptions: { maxRetries: 0, timeoutInMs: 10000 } });

async function step(name, fn) {
  const client = fresh();
  try {
    await fn(client);
  } finally {
    await client.close();
  }
  console.log(`step ${name}: ok`);
}

async function receiveAll(receiver, count) {
  const out = [];
  const deadline = Date.now() + 10000;
  while (out.length < count && Date.now() < deadline) {
    out.push(...(await receiver.receiveMessages(count - out.length, { maxWaitTimeInMs: 1000 })));
  }
  return out;
}

await step("send", async (client) => {
  const sender = client.createSender(queue);
  await sender.sendMessages([{ body: "p1" }, { body: "p2" }, { body: "p3" }]);
  await sender.close();
});

await step("peek from a fresh client", async (client) => {
  // peekMessages opens only the management link: put-token for `<queue>/$management`.
  const receiver = client.createReceiver(queue);
  const peeked = await receiver.peekMessages(10);
  assert.deepEqual(peeked.map((m) => m.body), ["p1", "p2", "p3"]);
  const next = await receiver.peekMessages(10, { fromSequenceNumber: peeked[2].sequenceNumber });
  assert.deepEqual(next.map((m) => m.body), ["p3"]);
  await receiver.close();
});

await step("schedule and cancel from a fresh client", async (client) => {
  const sender = client.createSender(queue);
  const later = new Date(Date.now() + 3600 * 1000);
  const [keep, cancel] = await sender.scheduleMessages([{ body: "keep" }, { body: "cancel" }], later);
  await sender.cancelScheduledMessages(cancel);
  await sender.close();
  const peeked = await client.createReceiver(queue).peekMessages(10);
  const scheduled = peeked.filter((m) => m.state === "scheduled");
  assert.deepEqual(
    scheduled.map((m) => [m.body, m.sequenceNumber.toString()]),
    [["keep", keep.toString()]],
  );
  assert.ok(Math.abs(scheduled[0].scheduledEnqueueTimeUtc.getTime() - later.getTime()) < 1000);
  const sender2 = client.createSender(queue);
  await sender2.cancelScheduledMessages(keep);
  await sender2.close();
  const after = await client.createReceiver(queue).peekMessages(10);
  assert.deepEqual(after.filter((m) => m.state === "scheduled"), []);
});

await step("rule manager round trip from a fresh client", async (client) => {
  const rules = client.createRuleManager(topic, subscription);
  const list = async () => {
    const out = [];
    for await (const rule of rules.listRules()) out.push(rule);
    return out;
  };
  const names = async () => (await list()).map((r) => r.name).sort();
  assert.deepEqual(await list(), [{ name: "$Default", filter: { sqlExpression: "1=1" }, action: {} }]);
  await rules.createRule("red", { sqlExpression: "color = 'red'" });
  await rules.createRule("eu-created", { subject: "created", applicationProperties: { region: "eu" } });
  await rules.createRule("stamped", { sqlExpression: "stamp = 1" }, { sqlExpression: "SET seen = 1" });
  await assert.rejects(rules.createRule("RED", { sqlExpression: "1=1" }), (e) => e.code === "MessagingEntityAlreadyExists");
  await assert.rejects(rules.createRule("broken", { sqlExpression: "color = " }));
  const listed = Object.fromEntries((await list()).map((r) => [r.name, r]));
  assert.deepEqual(Object.keys(listed).sort(), ["$Default", "eu-created", "red", "stamped"]);
  assert.deepEqual(listed.red.filter, { sqlExpression: "color = 'red'" });
  assert.equal(listed["eu-created"].filter.subject, "created");
  assert.deepEqual(listed["eu-created"].filter.applicationProperties, { region: "eu" });
  assert.equal(listed["eu-created"].filter.correlationId ?? undefined, undefined);
  assert.deepEqual(listed.stamped.action, { sqlExpression: "SET seen = 1" });
  await rules.deleteRule("$Default");
  await assert.rejects(rules.deleteRule("$Default"), (e) => e.code === "MessagingEntityNotFound");

  const sender = client.createSender(topic);
  await sender.sendMessages([
    { body: "red", applicationProperties: { color: "red" } },
    { body: "blue", applicationProperties: { color: "blue" } },
    { body: "eu", subject: "created", applicationProperties: { region: "eu" } },
    { body: "us", subject: "created", applicationProperties: { region: "us" } },
  ]);
  const receiver = client.createReceiver(topic, subscription, { receiveMode: "receiveAndDelete" });
  const got = await receiveAll(receiver, 2);
  assert.deepEqual(got.map((m) => m.body).sort(), ["eu", "red"]);
  assert.deepEqual(await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 }), []);

  await rules.deleteRule("red");
  await rules.deleteRule("stamped");
  assert.deepEqual(await names(), ["eu-created"]);
  await sender.sendMessages({ body: "red again", applicationProperties: { color: "red" } });
  assert.deepEqual(await receiver.receiveMessages(1, { maxWaitTimeInMs: 500 }), []);
  // Back to the default, for the next run on the same emulator.
  await rules.deleteRule("eu-created");
  await rules.createRule("$Default", { sqlExpression: "1=1" });
  assert.deepEqual(await names(), ["$Default"]);
  await sender.close();
  await receiver.close();
});

await step("deferral", async (client) => {
  const receiver = client.createReceiver(queue);
  const got = await receiveAll(receiver, 3);
  assert.deepEqual(got.map((m) => m.body), ["p1", "p2", "p3"]);
  await receiver.deferMessage(got[0]);
  await receiver.completeMessage(got[1]);
  await receiver.completeMessage(got[2]);
  const [deferred] = await receiver.receiveDeferredMessages(got[0].sequenceNumber);
  assert.equal(deferred.body, "p1");
  assert.equal(deferred.state, "deferred");
  await receiver.completeMessage(deferred);
  assert.deepEqual(await receiver.peekMessages(10), []);
  await receiver.close();
});

await step("dead-letter and resubmit", async (client) => {
  const sender = client.createSender(queue);
  await sender.sendMessages({ body: "poison", messageId: "dlq-1", applicationProperties: { attempt: 1 } });
  const receiver = client.createReceiver(queue);
  const [message] = await receiveAll(receiver, 1);
  await receiver.deadLetterMessage(message, { deadLetterReason: "Invalid", deadLetterErrorDescription: "bad body" });
  await receiver.close();

  // A fresh client peeks the dead-letter queue first: its first link is `<queue>/$DeadLetterQueue/$management`.
  const peekClient = fresh();
  const peeked = await peekClient.createReceiver(queue, { subQueueType: "deadLetter" }).peekMessages(10);
  assert.deepEqual(peeked.map((m) => [m.body, m.deadLetterReason]), [["poison", "Invalid"]]);
  await peekClient.close();

  const dlq = client.createReceiver(queue, { subQueueType: "deadLetter" });
  const [dead] = await receiveAll(dlq, 1);
  assert.deepEqual([dead.body, dead.deadLetterReason, dead.deadLetterErrorDescription], ["poison", "Invalid", "bad body"]);
  // Resubmit a corrected copy, then remove the dead letter.
  await sender.sendMessages({ body: "fixed", messageId: dead.messageId, applicationProperties: { attempt: 2 } });
  await dlq.completeMessage(dead);
  const again = client.createReceiver(queue);
  const [fixed] = await receiveAll(again, 1);
  assert.deepEqual([fixed.body, fixed.messageId, fixed.applicationProperties.attempt], ["fixed", "dlq-1", 2]);
  await again.completeMessage(fixed);
  assert.deepEqual(await dlq.peekMessages(10), []);
  await sender.close();
});

console.log("js management: ok");
