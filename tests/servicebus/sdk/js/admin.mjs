// Issue 33: the official JS SDK's ServiceBusAdministrationClient against the emulator's HTTPS
// management API (the TLS listener; NODE_EXTRA_CA_CERTS trusts the generated CA).
//
// Each step follows the flow of one of the SDK's v7 samples (azure-sdk-for-js
// sdk/servicebus/service-bus/samples/v7/javascript/): advanced/administrationClient.js,
// advanced/listingEntities.js, advanced/ruleManager.js and
// topicSubscriptionWithRuleOperationsSample.js. The samples themselves are not in the npm
// package and cannot be fetched here, so the flows are restated.
//
// Usage: node admin.mjs TLS_CONNECTION_STRING AMQP_CONNECTION_STRING
// Prints `<step>: ok` per step and `js admin: ok` at the end; exits 1 on any mismatch.

import { ServiceBusAdministrationClient, ServiceBusClient } from "@azure/service-bus";
import assert from "node:assert/strict";

const [tlsConnectionString, amqpConnectionString] = process.argv.slice(2);
const admin = new ServiceBusAdministrationClient(tlsConnectionString);
const suffix = Date.now();

async function administrationClient() {
  const queueName = `admin-q-${suffix}`;
  const created = await admin.createQueue(queueName);
  assert.equal(created.name, queueName);
  const queue = await admin.getQueue(queueName);
  queue.maxDeliveryCount = 12;
  const updated = await admin.updateQueue(queue);
  assert.equal(updated.maxDeliveryCount, 12);
  const runtime = await admin.getQueueRuntimeProperties(queueName);
  assert.equal(runtime.totalMessageCount, 0);
  const namespace = await admin.getNamespaceProperties();
  assert.equal(namespace.name, "sbemulatorns");
  await admin.deleteQueue(queueName);
  assert.equal(await admin.queueExists(queueName), false);
  await assert.rejects(admin.getQueue(queueName), (e) => e.code === "MessageEntityNotFoundError");
  await admin.createQueue(queueName);
  await assert.rejects(admin.createQueue(queueName), (e) => e.code === "MessageEntityAlreadyExistsError");
  await admin.deleteQueue(queueName);
}

async function listingEntities() {
  const names = [];
  for (let i = 0; i < 5; i++) {
    names.push(`list-q-${suffix}-${i}`);
    await admin.createQueue(names[i]);
  }
  const topicName = `list-t-${suffix}`;
  await admin.createTopic(topicName);
  await admin.createSubscription(topicName, "sub-a");
  await admin.createSubscription(topicName, "sub-b");
  const queues = [];
  for await (const q of admin.listQueues()) queues.push(q.name);
  for (const n of names) assert.ok(queues.includes(n), `${n} in ${queues}`);
  // By pages of two: three pages for five queues of ours (and the configured one).
  const pages = [];
  for await (const page of admin.listQueues().byPage({ maxPageSize: 2 })) pages.push(page.map((q) => q.name));
  assert.ok(pages.length >= 3, JSON.stringify(pages));
  assert.deepEqual(pages.flat().sort(), queues.slice().sort());
  const runtime = [];
  for await (const q of admin.listQueuesRuntimeProperties()) runtime.push(q.name);
  assert.deepEqual(runtime.sort(), queues.slice().sort());
  const topics = [];
  for await (const t of admin.listTopics()) topics.push(t.name);
  assert.ok(topics.includes(topicName), JSON.stringify(topics));
  const subs = [];
  for await (const s of admin.listSubscriptions(topicName)) subs.push(s.subscriptionName);
  assert.deepEqual(subs, ["sub-a", "sub-b"]);
  const rules = [];
  for await (const r of admin.listRules(topicName, "sub-a")) rules.push(r.name);
  assert.deepEqual(rules, ["$Default"]);
  for (const n of names) await admin.deleteQueue(n);
  await admin.deleteTopic(topicName);
}

async function ruleManager() {
  const topicName = `topic-rulemanager-${suffix}`;
  const subscriptionName = "subscription-rule-manager";
  await admin.createTopic(topicName);
  await admin.createSubscription(topicName, subscriptionName);
  // The rule manager works over AMQP ($management); the topic came from HTTPS a moment ago.
  const client = new ServiceBusClient(amqpConnectionString);
  const rules = client.createRuleManager(topicName, subscriptionName);
  await rules.createRule("sqlRule", { sqlExpression: "price > 10" });
  await rules.createRule("correlationRule", {
    correlationId: "correlationId",
    subject: "label",
    applicationProperties: { key1: "value1", key2: 2, key3: true },
  });
  const names = [];
  for await (const r of rules.listRules()) names.push(r.name);
  assert.deepEqual(names.sort(), ["$Default", "correlationRule", "sqlRule"]);
  // The same rules over HTTPS, with the correlation filter's typed properties.
  const viaHttp = await admin.getRule(topicName, subscriptionName, "correlationRule");
  assert.deepEqual(viaHttp.filter.applicationProperties, { key1: "value1", key2: 2, key3: true });
  await rules.deleteRule("sqlRule");
  await rules.deleteRule("correlationRule");
  const left = [];
  for await (const r of admin.listRules(topicName, subscriptionName)) left.push(r.name);
  assert.deepEqual(left, ["$Default"]);
  await admin.deleteTopic(topicName);
  await client.close();
}

async function topicSubscriptionWithRuleOperations() {
  const topicName = `TopicSubscriptionWithRuleOperations${suffix}`;
  await admin.createTopic(topicName);
  await admin.createSubscription(topicName, "NoFilterSubscription");
  await admin.deleteRule(topicName, "NoFilterSubscription", "$Default");
  await admin.createRule(topicName, "NoFilterSubscription", "$Default", { sqlExpression: "1=1" });
  await admin.createSubscription(topicName, "RedSqlFilterSubscription", {
    defaultRuleOptions: { name: "RedSqlRule", filter: { sqlExpression: "Color = 'Red'" } },
  });
  await admin.createSubscription(topicName, "ImportantCorrelationFilterSubscription", {
    defaultRuleOptions: { name: "ImportantCorrelationRule", filter: { subject: "Red", correlationId: "important" } },
  });
  const client = new ServiceBusClient(amqpConnectionString);
  const messages = [];
  for (const subject of ["Red", "Blue", "Green"]) {
    for (const [i, correlationId] of [undefined, "notimportant", "important"].entries()) {
      messages.push({ subject, body: `test-${subject.toLowerCase()}${i + 1}`, correlationId, applicationProperties: { Color: subject } });
    }
  }
  await client.createSender(topicName).sendMessages(messages);
  const receiver = client.createReceiver(topicName, "ImportantCorrelationFilterSubscription");
  const received = await receiver.receiveMessages(10, { maxWaitTimeInMs: 3000 });
  assert.deepEqual(received.map((m) => m.body), ["test-red3"]);
  const red = await admin.getSubscriptionRuntimeProperties(topicName, "RedSqlFilterSubscription");
  assert.equal(red.activeMessageCount, 3);
  const all = await admin.getSubscriptionRuntimeProperties(topicName, "NoFilterSubscription");
  assert.equal(all.activeMessageCount, 9);
  for (const s of ["NoFilterSubscription", "RedSqlFilterSubscription", "ImportantCorrelationFilterSubscription"]) {
    await admin.deleteSubscription(topicName, s);
  }
  await admin.deleteTopic(topicName);
  await client.close();
}

for (const [name, step] of Object.entries({
  administrationClient,
  listingEntities,
  ruleManager,
  topicSubscriptionWithRuleOperations,
})) {
  await step();
  console.log(`${name}: ok`);
}
console.log("js admin: ok");
