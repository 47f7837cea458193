// Official JavaScript SDK (@azure/service-bus, pinned in package.json) with message sessions:
// acceptNextSession over two sessions (FIFO per session), acceptSession on a named session with
// state and a renewed lock, a second acceptSession refused while the session is locked.
// Usage: node sessions.mjs CONNECTION_STRING (queue "sessions", RequiresSession).
// Prints "NAME: ok" per step; exits non-zero on any mismatch.
import assert from "node:assert/strict";
import { ServiceBusClient } from "@azure/service-bus";

const client = new ServiceBusClient(process.argv[2], { retryOptions: { maxRetries: 0 } });
const queue = "sessions";

async function receiveAll(receiver, count) {
  const out = [];
  const deadline = Date.now() + 10000;
  while (out.length < count && Date.now() < deadline) {
    out.push(...(await receiver.receiveMessages(count - out.length, { maxWaitTimeInMs: 1000 })));
  }
  return out;
}

try {
  const sender = client.createSender(queue);
  const messages = [];
  for (let i = 0; i < 3; i++) {
    for (const s of ["red", "blue"]) messages.push({ body: `${s}-${i}`, sessionId: s });
  }
  await sender.sendMessages(messages);

  const seen = [];
  for (let n = 0; n < 2; n++) {
    const receiver = await client.acceptNextSession(queue, { maxAutoLockRenewalDurationInMs: 0 });
    const sid = receiver.sessionId;
    assert.ok(receiver.sessionLockedUntilUtc.getTime() > Date.now(), `${receiver.sessionLockedUntilUtc}`);
    const got = await receiveAll(receiver, 3);
    assert.deepEqual(got.map((m) => m.body), [0, 1, 2].map((i) => `${sid}-${i}`));
    assert.ok(got.every((m) => m.sessionId === sid));
    for (const m of got) await receiver.completeMessage(m);
    await receiver.close();
    seen.push(sid);
  }
  assert.deepEqual(seen.sort(), ["blue", "red"]);
  console.log("accept next session: ok");

  await sender.sendMessages({ body: "step", sessionId: "order-9" });
  const named = await client.acceptSession(queue, "order-9", { maxAutoLockRenewalDurationInMs: 0 });
  assert.equal(named.sessionId, "order-9");
  await assert.rejects(client.acceptSession(queue, "order-9"), (e) => e.code === "SessionCannotBeLocked");
  console.log("second receiver refused: ok");
  await named.setSessionState("checkpoint");
  const before = named.sessionLockedUntilUtc.getTime();
  await new Promise((r) => setTimeout(r, 50));
  const renewed = await named.renewSessionLock();
  assert.ok(renewed.getTime() > before, `${renewed.getTime()} > ${before}`);
  const [step] = await receiveAll(named, 1);
  assert.equal(step.body, "step");
  await named.completeMessage(step);
  await named.close();
  const later = await client.acceptSession(queue, "order-9");
  assert.equal(String(await later.getSessionState()), "checkpoint");
  await later.close();
  console.log("session state and renewed lock: ok");
  await sender.close();
  console.log("js sessions: ok");
} finally {
  await client.close();
}
