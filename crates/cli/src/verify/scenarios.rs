//! The article's verification scenarios, each a function that passes or says what broke.
//!
//! Each runs the library's own [`Runtime`] with the reference inventory consumer
//! ([`OrderPlacedConsumer`]) against the user's namespace and a scratch store, one delivery at
//! a time, and judges by the runtime's reported outcome, the broker's answers and the rows the
//! store holds. Order ids and message ids carry the run's prefix, so a scenario never meets
//! another run's messages.

use std::time::{Duration, Instant};

use sb_inbox::relay::{Relay, RelayConfig};
use sb_inbox::runtime::{DelayedRetry, RetryPolicy};
use sb_inbox::servicebus::{ServiceBusClient, ServiceBusReceiver, ServiceBusSenderPort};
use sb_inbox::{
    ConsumerName, DeadLetterReason, DuplicateScope, Handler, HandlerError, Message, OutboxStore,
    Outcome, Receiver, Runtime, RuntimeConfig, Store, StoreTx,
};
use tokio_util::sync::CancellationToken;

use crate::inventory::{
    CONTRACT, EVENT_CONTRACT, InventoryStore, InventoryTx, OrderLine, OrderPlaced,
    OrderPlacedConsumer,
};
use crate::ops::send::OrderMessage;

use super::report::{Measurements, ScenarioResult, Status};
use super::scratch::Entities;

/// How long a scenario waits for a message the broker should deliver.
pub const DELIVERY_WAIT: Duration = Duration::from_secs(15);

/// The delayed retry's first delay.
const RETRY_DELAY: Duration = Duration::from_secs(3);

/// How far the broker's clock may be off the host's before an early retry counts as early.
const CLOCK_TOLERANCE: Duration = Duration::from_secs(2);

/// The child's stdout, line by line.
type ChildLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// The lock margin of every runtime verify runs (defined beside the child, which runs one too:
/// the child is the lower module, so scenarios import it and not the other way).
pub use super::child::LOCK_MARGIN;

/// How long the lock-loss scenario waits for the redelivery: longer than the longest lock a
/// given queue can have, 5 min (Microsoft Learn, `CreateQueueOptions.LockDuration`: "Max value
/// is 5 minutes. Default value is 60 seconds.").
const LOCK_LOSS_WAIT: Duration = Duration::from_secs(320);

/// How often the token refresh scenario's sender sends while its token ages: shorter than any
/// link idle timeout a broker uses (the service's is 10 minutes).
const TOKEN_BEAT: Duration = Duration::from_secs(1);

/// How long the crash scenario's child may take to receive and commit.
const CHILD_WAIT: Duration = Duration::from_secs(60);

/// How long the redelivery after the crash may take: at once where the broker drops a dead
/// connection's locks (the service: Microsoft Learn, "Message transfers, locks, and
/// settlement"), else after the lock expires (scratch queues lock for 30 s).
const REDELIVERY_WAIT: Duration = Duration::from_secs(45);

/// A scenario's reason when a signal stopped the run.
const INTERRUPTED: &str = "interrupted (Ctrl-C or SIGTERM)";

/// The names of the scenarios, in the order they run.
pub const SCENARIOS: &[&str] = &[
    "duplicate_delivery",
    "republished_message",
    "dead_letter_reason",
    "session_order",
    "outbox_relayed_once",
    "store_conformance",
    "lock_loss_fenced",
    "crash_between_commit_and_settlement",
    "delayed_retry",
    "idle_detach_survival",
    "token_refresh",
];

/// What every scenario works with.
#[derive(Debug)]
pub struct Harness<S> {
    /// The namespace.
    pub client: ServiceBusClient,
    /// The scratch store (migrated, inventory tables included).
    pub store: S,
    /// The entities.
    pub entities: Entities,
    /// The run's prefix (`sbv-xxxxxxxx`).
    pub prefix: String,
    /// How to start the crash scenario's child process; `None` when the store cannot be
    /// opened by another process (an in-memory database).
    pub child: Option<ChildCommand>,
    /// How long the idle-detach scenario leaves its sender idle; `None` skips it.
    pub idle: Option<Duration>,
    /// The token refresh scenario's client; `None` skips it.
    pub token_refresh: Option<super::TokenRefresh>,
    /// The scenarios to run (`--scenario`); empty: all of them.
    pub only: Vec<String>,
}

/// `sb-inbox verify-child` as verify starts it: this same executable, the namespace settings
/// in its environment (never on its command line), the scratch store's URL.
#[derive(Debug, Clone)]
pub struct ChildCommand {
    /// The executable (verify's own).
    pub program: std::path::PathBuf,
    /// Environment variables naming the namespace and its credentials.
    pub env: Vec<(String, String)>,
    /// The scratch store, as the child opens it.
    pub store: ChildStore,
}

/// The scratch store as the child opens it: a URL (in its environment, never on its command
/// line: it may hold a password) and, for SQL Server, the user its sessions run as.
#[derive(Debug, Clone)]
pub struct ChildStore {
    /// The store URL or connection string.
    pub url: String,
    /// SQL Server: the scratch schema's user (`--store-user`).
    pub execute_as: Option<String>,
}

impl ChildStore {
    /// A store the URL alone scopes (a search path, a file).
    pub fn url(url: String) -> Self {
        ChildStore {
            url,
            execute_as: None,
        }
    }
}

/// A scenario's verdict: `Ok(what was seen)` or `Err(what broke)`.
type Verdict = Result<String, String>;

impl<S> Harness<S>
where
    S: InventoryStore + OutboxStore + Clone,
{
    /// Runs every scenario; a cancelled `stop` ends the run early (the rest are reported
    /// skipped).
    pub async fn run_all(&self, stop: &CancellationToken) -> Vec<ScenarioResult> {
        let mut results = Vec::new();
        for &name in SCENARIOS {
            let started = Instant::now();
            // An interrupted scenario proved nothing: it fails, so the run cannot exit 0 or 3.
            let verdict = if stop.is_cancelled() {
                Ok(Err(INTERRUPTED.to_owned()))
            } else if !self.only.is_empty() && !self.only.iter().any(|o| o == name) {
                Err(Skip("not selected (--scenario)".to_owned()))
            } else {
                tokio::select! {
                    verdict = self.scenario(name) => verdict,
                    () = stop.cancelled() => Ok(Err(INTERRUPTED.to_owned())),
                }
            };
            let (status, reason) = match verdict {
                Ok(Ok(seen)) => (Status::Passed, seen),
                Ok(Err(broke)) => (Status::Failed, broke),
                Err(Skip(why)) => (Status::Skipped, why),
            };
            let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            tracing::info!(scenario = name, ?status, %reason, "Scenario done.");
            results.push(ScenarioResult {
                name,
                status,
                reason,
                millis,
            });
        }
        results
    }

    /// One scenario: `Ok(verdict)` when it ran, `Err(skip)` when it could not here.
    async fn scenario(&self, name: &str) -> Result<Verdict, Skip> {
        match name {
            "duplicate_delivery" => Ok(self.duplicate_delivery().await),
            "republished_message" => Ok(self.republished_message().await),
            "dead_letter_reason" => Ok(self.dead_letter_reason().await),
            "session_order" => match &self.entities.session_queue {
                Some(queue) => Ok(self.session_order(queue).await),
                None => Err(Skip(
                    "needs a queue that requires sessions (--session-queue)".to_owned(),
                )),
            },
            "outbox_relayed_once" => Ok(self.outbox_relayed_once().await),
            "store_conformance" => Ok(match sb_inbox::conformance::run(self.store.clone()).await {
                Ok(()) => Ok(format!(
                    "{} checks passed",
                    sb_inbox::conformance::CHECKS.len()
                )),
                Err(failure) => Err(failure.to_string()),
            }),
            "lock_loss_fenced" => match &self.child {
                Some(child) => Ok(self.lock_loss_fenced(child).await),
                None => Err(Skip(
                    "needs a store another process can open (not sqlite::memory:)".to_owned(),
                )),
            },
            "crash_between_commit_and_settlement" => match &self.child {
                Some(child) => Ok(self.crash_between_commit_and_settlement(child).await),
                None => Err(Skip(
                    "needs a store another process can open (not sqlite::memory:)".to_owned(),
                )),
            },
            "delayed_retry" => Ok(self.delayed_retry().await),
            "idle_detach_survival" => match self.idle {
                Some(idle) => Ok(self.idle_detach_survival(idle).await),
                None => Err(Skip(
                    "needs --idle-secs: 660 against a namespace (the service detaches links idle \
                     for 10 min), or past an emulator's --link-idle-timeout"
                        .to_owned(),
                )),
            },
            "token_refresh" => match &self.token_refresh {
                Some(refresh) => Ok(self.token_refresh(refresh).await),
                None => Err(Skip(
                    "needs --token-refresh and a connection string with a key (verify then \
                     signs tokens valid for --token-lifetime, 150 s by default; an Entra ID \
                     token's life is the identity platform's)"
                        .to_owned(),
                )),
            },
            _ => Err(Skip(format!("unknown scenario {name}"))),
        }
    }

    fn consumer(&self) -> Result<ConsumerName, String> {
        ConsumerName::new(format!("verify.{}", self.prefix)).map_err(|e| e.to_string())
    }

    /// A runtime of the reference consumer on `queue`, one delivery at a time.
    fn runtime(
        &self,
        queue: &str,
        handler: OrderPlacedConsumer,
    ) -> Result<
        (
            ServiceBusReceiver,
            Runtime<ServiceBusReceiver, S, OrderPlacedConsumer>,
        ),
        String,
    > {
        let receiver = self.client.receiver(queue, 0);
        let runtime = Runtime::new(
            receiver.clone(),
            self.store.clone(),
            handler,
            self.config(queue)?,
        );
        Ok((receiver, runtime))
    }

    /// The runtime configuration of every consumer verify runs on `queue`: one delivery at a
    /// time, [`LOCK_MARGIN`], and the entity's lock duration when the management API gave it
    /// (as the `Worker` sets it from its start check), so no lock is reckoned longer than it.
    fn config(&self, queue: &str) -> Result<RuntimeConfig, String> {
        let mut config = RuntimeConfig::new(self.consumer()?);
        config.concurrency = 1;
        config.lock_margin = LOCK_MARGIN;
        config.lock_duration = self.entities.lock_duration(queue);
        Ok(config)
    }

    fn order(&self, message_id: &str, order_id: &str) -> Result<Message, String> {
        OrderMessage {
            message_id: format!("{}-{message_id}", self.prefix),
            order: OrderPlaced {
                order_id: format!("{}-{order_id}", self.prefix),
                lines: vec![OrderLine {
                    sku: format!("{}-sku", self.prefix),
                    quantity: 2,
                }],
            },
        }
        .to_message()
        .map_err(|e| e.to_string())
    }

    async fn send(&self, queue: &str, message: Message) -> Result<(), String> {
        self.client
            .sender(queue)
            .send(message)
            .await
            .map_err(|e| format!("sending to {queue}: {e}"))
    }

    async fn reservations(&self) -> Result<i64, String> {
        self.store
            .inventory_counts()
            .await
            .map(|c| c.reservations)
            .map_err(|e| format!("counting reservations: {e}"))
    }

    /// Checks that exactly one reservation was made since the count was `before`: one order,
    /// one effect.
    async fn one_reservation_since(&self, before: i64) -> Result<(), String> {
        let effect = self.reservations().await? - before;
        if effect != 1 {
            return Err(format!("{effect} reservations for one order"));
        }
        Ok(())
    }

    /// Receives the next delivery of `receiver` and processes it; the outcome, or why none came.
    async fn process_next(
        &self,
        receiver: &ServiceBusReceiver,
        runtime: &Runtime<ServiceBusReceiver, S, OrderPlacedConsumer>,
        what: &str,
    ) -> Result<Outcome, String> {
        self.process_next_within(receiver, runtime, what, DELIVERY_WAIT)
            .await
    }

    /// As [`Harness::process_next`], waiting up to `wait`.
    async fn process_next_within(
        &self,
        receiver: &ServiceBusReceiver,
        runtime: &Runtime<ServiceBusReceiver, S, OrderPlacedConsumer>,
        what: &str,
        wait: Duration,
    ) -> Result<Outcome, String> {
        let delivery = receive_within(receiver, wait, what).await?;
        let report = runtime.process(delivery).await;
        match &report.settled {
            None | Some(Ok(())) => Ok(report.outcome),
            Some(Err(error)) => Err(format!(
                "{what} was {:?} but its settlement failed: {error}",
                report.outcome
            )),
        }
    }

    /// Two copies under one message id: the first is processed, the second recognised as an
    /// inbox duplicate, both completed, one reservation.
    async fn duplicate_delivery(&self) -> Verdict {
        let queue = &self.entities.queue;
        let before = self.reservations().await?;
        let message = self.order("dup-1", "dup")?;
        self.send(queue, message.clone()).await?;
        self.send(queue, message).await?;
        let (receiver, runtime) = self.runtime(queue, OrderPlacedConsumer::new())?;
        let result = async {
            let first = self
                .process_next(&receiver, &runtime, "the first copy")
                .await?;
            let second = self
                .process_next(&receiver, &runtime, "the second copy")
                .await
                .map_err(|e| {
                    format!(
                        "{e}: the broker dropped it (is duplicate detection on for {queue}? \
                         verify needs both copies delivered)"
                    )
                })?;
            if (first, second)
                != (
                    Outcome::Processed,
                    Outcome::Duplicate(DuplicateScope::Inbox),
                )
            {
                return Err(format!(
                    "expected Processed then an inbox Duplicate, got {first:?} then {second:?}"
                ));
            }
            self.one_reservation_since(before).await?;
            Ok("second copy recognised as an inbox duplicate; one reservation".to_owned())
        }
        .await;
        receiver.close().await;
        result
    }

    /// The same order republished under a new message id: the business key recognises it.
    async fn republished_message(&self) -> Verdict {
        let queue = &self.entities.queue;
        let before = self.reservations().await?;
        self.send(queue, self.order("rep-1", "rep")?).await?;
        self.send(queue, self.order("rep-2", "rep")?).await?;
        let (receiver, runtime) = self.runtime(queue, OrderPlacedConsumer::new())?;
        let result = async {
            let first = self
                .process_next(&receiver, &runtime, "the original")
                .await?;
            let second = self
                .process_next(&receiver, &runtime, "the republished copy")
                .await?;
            let expected = (
                Outcome::Processed,
                Outcome::Duplicate(DuplicateScope::BusinessKey),
            );
            if (first, second) != expected {
                return Err(format!(
                    "expected Processed then a business-key Duplicate, got {first:?} then \
                     {second:?}"
                ));
            }
            self.one_reservation_since(before).await?;
            Ok("new message id, same order: a business-key duplicate; one reservation".to_owned())
        }
        .await;
        receiver.close().await;
        result
    }

    /// A body that cannot be read is dead-lettered `InvalidPayload`, and the reason is read
    /// back from the dead-letter queue (then the dead letter is removed).
    async fn dead_letter_reason(&self) -> Verdict {
        let queue = &self.entities.queue;
        let id = format!("{}-poison-1", self.prefix);
        self.send(queue, Message::new(id.clone(), CONTRACT, "{nope"))
            .await?;
        let (receiver, runtime) = self.runtime(queue, OrderPlacedConsumer::new())?;
        let outcome = self
            .process_next(&receiver, &runtime, "the poison message")
            .await;
        receiver.close().await;
        let outcome = outcome?;
        if outcome != Outcome::Permanent(DeadLetterReason::InvalidPayload) {
            return Err(format!(
                "expected Permanent(InvalidPayload), got {outcome:?}"
            ));
        }
        // The dead letter, read back as an operator would, then taken out.
        let dlq = format!("{queue}/$DeadLetterQueue");
        let dead = self.client.receiver(&dlq, 0);
        // Dead letters of earlier scenarios (a broken store dead-letters their orders) are
        // verify's too: read past them to this one.
        let read = async {
            let mut others = Vec::new();
            loop {
                let delivery =
                    match tokio::time::timeout(DELIVERY_WAIT, dead.receive_message()).await {
                        Ok(Ok(Some(delivery))) => delivery,
                        Ok(Ok(None)) | Err(_) => {
                            return Err(format!(
                                "{id} did not arrive in {dlq} (found only {others:?})"
                            ));
                        }
                        Ok(Err(error)) => return Err(format!("receiving from {dlq}: {error}")),
                    };
                let message = delivery.message();
                let got = message.message_id.clone().unwrap_or_default();
                let reason = message.dead_letter_reason().map(str::to_owned);
                delivery
                    .complete()
                    .await
                    .map_err(|e| format!("completing the dead letter: {e}"))?;
                if got != id {
                    others.push(got);
                    continue;
                }
                return match reason {
                    Some(reason) if reason == "InvalidPayload" => Ok(format!(
                        "dead-lettered; reason {reason:?} read back from {dlq}"
                    )),
                    other => Err(format!(
                        "{id} is in {dlq} with reason {other:?}, not InvalidPayload"
                    )),
                };
            }
        }
        .await;
        dead.close().await;
        read
    }

    /// A consumer process killed (SIGKILL) after its commit and before its settlement: the
    /// broker redelivers (the service drops a connection's locks with it), and the redelivery
    /// is recognised as an inbox duplicate; one reservation.
    async fn crash_between_commit_and_settlement(&self, child: &ChildCommand) -> Verdict {
        let queue = &self.entities.queue;
        let before = self.reservations().await?;
        self.send(queue, self.order("crash-1", "crash")?).await?;
        let (mut process, mut lines) = self.spawn_child(child, queue, false)?;
        let said = Self::child_says(&mut lines).await;
        // SIGKILL: no settlement, no goodbye on the connection.
        let killed = process.kill().await;
        let said = said?;
        if said != super::child::COMMITTED {
            return Err(format!("the child did not commit: {said}"));
        }
        killed.map_err(|e| format!("killing the child: {e}"))?;
        let (receiver, runtime) = self.runtime(queue, OrderPlacedConsumer::new())?;
        let redelivered = self
            .process_next_within(&receiver, &runtime, "the redelivery", REDELIVERY_WAIT)
            .await;
        receiver.close().await;
        let outcome = redelivered?;
        if outcome != Outcome::Duplicate(DuplicateScope::Inbox) {
            return Err(format!(
                "the redelivery after the crash was {outcome:?}, not an inbox Duplicate"
            ));
        }
        self.one_reservation_since(before).await?;
        Ok(
            "killed after commit; the redelivery was an inbox duplicate; one reservation"
                .to_owned(),
        )
    }

    /// `sb-inbox verify-child` on `queue` (`--stall`: its handler stalls the process), its
    /// stdout read line by line.
    fn spawn_child(
        &self,
        child: &ChildCommand,
        queue: &str,
        stall: bool,
    ) -> Result<(tokio::process::Child, ChildLines), String> {
        let mut command = tokio::process::Command::new(&child.program);
        command
            .args(["verify-child", "--queue", queue, "--consumer"])
            .arg(self.consumer()?.as_str());
        if stall {
            command.arg("--stall");
        }
        if let Some(user) = &child.store.execute_as {
            command.arg("--store-user").arg(user);
        }
        // The child's lock keeper is bounded by the entity's lock as the parent read it, as a
        // worker's is by its start check's.
        if let Some(lock) = self.entities.lock_duration(queue) {
            command
                .arg("--lock-duration-ms")
                .arg(lock.as_millis().to_string());
        }
        let mut process = command
            .env_remove("SB_INBOX_SERVICEBUS_CONNECTION")
            .env_remove("SB_INBOX_SERVICEBUS_NAMESPACE")
            .env("SB_INBOX_STORE", &child.store.url)
            .envs(child.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting the child process: {e}"))?;
        let stdout = process
            .stdout
            .take()
            .ok_or_else(|| "the child has no stdout".to_owned())?;
        Ok((
            process,
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        ))
    }

    /// The child's next line within [`CHILD_WAIT`], or what happened instead.
    async fn child_says(lines: &mut ChildLines) -> Result<String, String> {
        match tokio::time::timeout(CHILD_WAIT, lines.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) | Ok(Err(_)) => Err("the child ended without a word".to_owned()),
            Err(_) => Err(format!(
                "the child said nothing within {}s",
                CHILD_WAIT.as_secs()
            )),
        }
    }

    /// A consumer process stalls (a long GC pause, a frozen VM) with its transaction open,
    /// past its lock: the broker redelivers to another consumer (verify), which processes it
    /// once the stalled one resumes; the stalled one's commit is fenced (`LockLost`), so one
    /// reservation.
    async fn lock_loss_fenced(&self, child: &ChildCommand) -> Verdict {
        use tokio::io::AsyncWriteExt as _;
        let queue = &self.entities.lock_queue;
        let before = self.reservations().await?;
        self.send(queue, self.order("lock-1", "lock")?).await?;
        let (mut process, mut lines) = self.spawn_child(child, queue, true)?;
        let said = Self::child_says(&mut lines).await?;
        if said != super::child::STALLED {
            return Err(format!("the child did not reach its handler: {said}"));
        }
        let (receiver, runtime) = self.runtime(queue, OrderPlacedConsumer::new())?;
        let result = async {
            // The lock as the management API gave it, and the delivery's own wait; without it
            // the longest lock an entity can have.
            let wait = self
                .entities
                .lock_duration(queue)
                .map_or(LOCK_LOSS_WAIT, |lock| lock + DELIVERY_WAIT);
            let delivery = receive_within(&receiver, wait, "the redelivery")
                .await
                .map_err(|e| {
                    format!("{e} while the first consumer stalled: does {queue} lock for longer?")
                })?;
            // The stalled consumer resumes: its handler returns and its runtime must not commit.
            let mut stdin = process
                .stdin
                .take()
                .ok_or_else(|| "the child has no stdin".to_owned())?;
            stdin
                .write_all(b"go\n")
                .await
                .map_err(|e| format!("resuming the child: {e}"))?;
            let outcome = runtime.process(delivery).await;
            let child_said = Self::child_says(&mut lines).await?;
            if child_said == super::child::COMMITTED {
                return Err(
                    "the stalled consumer committed after its lock was lost: no fence".to_owned()
                );
            }
            let child_outcome = child_said
                .strip_prefix(super::child::OUTCOME)
                .ok_or_else(|| format!("the child: {child_said}"))?
                .to_owned();
            if child_outcome != format!("{:?}", Outcome::LockLost) {
                return Err(format!(
                    "the stalled consumer ended {child_outcome}, not LockLost"
                ));
            }
            if outcome.outcome != Outcome::Processed {
                return Err(format!(
                    "the redelivery was {:?}, not Processed",
                    outcome.outcome
                ));
            }
            self.one_reservation_since(before).await?;
            Ok("the stalled consumer's commit was fenced (LockLost); the redelivery was processed once".to_owned())
        }
        .await;
        receiver.close().await;
        // Whatever happened, the child is done.
        let _ = process.kill().await;
        result
    }

    /// A transient failure with delayed retries on: the original is completed and a copy
    /// scheduled on the broker; the copy arrives no earlier than scheduled and is processed
    /// once.
    async fn delayed_retry(&self) -> Verdict {
        let queue = &self.entities.queue;
        let before = self.reservations().await?;
        self.send(queue, self.order("retry-1", "retry")?).await?;
        let policy =
            RetryPolicy::new(3, RETRY_DELAY, RETRY_DELAY * 4).map_err(|e| e.to_string())?;
        let receiver = self.client.receiver(queue, 0);
        let mut config = self.config(queue)?;
        config.delayed_retry = Some(DelayedRetry::new(
            policy,
            ServiceBusSenderPort::new(self.client.clone()),
            queue.clone(),
        ));
        let handler = FailFirst {
            inner: OrderPlacedConsumer::new(),
            failed: std::sync::atomic::AtomicBool::new(false),
        };
        let runtime = Runtime::new(receiver.clone(), self.store.clone(), handler, config);
        let result = async {
            let first = receive_within(&receiver, DELIVERY_WAIT, "the order").await?;
            let report = runtime.process(first).await;
            let scheduled = match (&report.outcome, &report.retry, &report.settled) {
                (Outcome::Transient, Some(retry), Some(Ok(()))) => retry.at,
                other => {
                    return Err(format!(
                        "expected a transient failure retried later, got {other:?}"
                    ));
                }
            };
            let copy = receive_within(&receiver, DELIVERY_WAIT + RETRY_DELAY * 4, "the retry")
                .await?;
            let arrived = std::time::SystemTime::now();
            // The broker's clock may be a little off the host's (where `at` was computed).
            if arrived + CLOCK_TOLERANCE < scheduled {
                return Err(format!(
                    "the retry arrived {:?} before its scheduled time",
                    scheduled.duration_since(arrived).unwrap_or_default()
                ));
            }
            let outcome = runtime.process(copy).await.outcome;
            if outcome != Outcome::Processed {
                return Err(format!("the retry was {outcome:?}, not Processed"));
            }
            self.one_reservation_since(before).await?;
            Ok(format!(
                "transient failure: original completed, copy scheduled {:.1}s later, processed once",
                report.retry.map(|r| r.delay).unwrap_or_default().as_secs_f64()
            ))
        }
        .await;
        receiver.close().await;
        result
    }

    /// A sender used, left idle for `idle` (past the service's link idle timeout, which
    /// detaches it: Microsoft Learn, "Troubleshoot AMQP errors in Azure Service Bus",
    /// learn.microsoft.com/azure/service-bus-messaging/service-bus-amqp-troubleshoot: a link
    /// is closed after 10 minutes idle), then used again: the link was detached meanwhile and
    /// replaced (the sender attached a second one), the second send goes through and both
    /// messages arrive. A link never detached fails the scenario: it showed nothing.
    async fn idle_detach_survival(&self, idle: Duration) -> Verdict {
        let queue = &self.entities.queue;
        let sender = self.client.sender(queue);
        let ids = [
            format!("{}-idle-1", self.prefix),
            format!("{}-idle-2", self.prefix),
        ];
        sender
            .send(Message::new(ids[0].clone(), "verify.idle.v1", "{}"))
            .await
            .map_err(|e| format!("the first send: {e}"))?;
        // The idle period is the scenario itself.
        tokio::time::sleep(idle).await;
        sender
            .send(Message::new(ids[1].clone(), "verify.idle.v1", "{}"))
            .await
            .map_err(|e| format!("the send after {}s idle: {e}", idle.as_secs()))?;
        let got = self
            .read_back(queue, &ids, "the idle sender's messages")
            .await?;
        if got != ids {
            return Err(format!("sent {ids:?}, received {got:?}"));
        }
        // A sender whose link was never detached proved nothing about surviving a detach.
        match sender.links_attached() {
            links if links >= 2 => Ok(format!(
                "the sender's link was detached while idle {}s and replaced ({links} links \
                 attached); both messages arrived",
                idle.as_secs()
            )),
            links => Err(format!(
                "the sender's link was never detached in {}s idle ({links} link attached): \
                 the idle was shorter than the broker's link idle timeout, so surviving a \
                 detach was not shown (the service detaches links idle for 10 minutes: \
                 --idle-secs 660)",
                idle.as_secs()
            )),
        }
    }

    /// A sender on a client whose tokens live 150 s, sending every [`TOKEN_BEAT`] (so no idle
    /// timeout detaches its link): the client asks for a fresh token for the entity before the
    /// first runs out, and the sender works after the first one's expiry on the link it
    /// attached first. The service drops an entity's links when their token
    /// expires without a fresh put-token (Microsoft Learn, "AMQP 1.0 in Azure Service Bus and
    /// Event Hubs protocol guide", learn.microsoft.com/azure/service-bus-messaging/
    /// service-bus-amqp-protocol-guide, "Claims-based authorization"; the detach text in
    /// azure-sdk-for-python issue 23487): a second link means the refresh came too late.
    async fn token_refresh(&self, refresh: &super::TokenRefresh) -> Verdict {
        let queue = &self.entities.queue;
        let sender = refresh.client.sender(queue);
        let ids = [
            format!("{}-token-1", self.prefix),
            format!("{}-token-2", self.prefix),
        ];
        sender
            .send(Message::new(ids[0].clone(), "verify.token.v1", "{}"))
            .await
            .map_err(|e| format!("the first send: {e}"))?;
        let audience = format!("sb://{}/{}", refresh.client.host(), queue);
        let first = refresh
            .tokens
            .issued_for(&audience)
            .first()
            .cloned()
            .ok_or_else(|| format!("no token was asked for {audience}"))?;
        // Past the first token's expiry, sending all along: the scenario is this wait.
        let until_expired = first
            .expires_at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        self.keep_sending(&sender, until_expired + Duration::from_secs(5))
            .await?;
        sender
            .send(Message::new(ids[1].clone(), "verify.token.v1", "{}"))
            .await
            .map_err(|e| format!("the send after the first token expired: {e}"))?;
        // A link the broker detached for an expired token and the sender replaced would
        // still have sent both messages: the refresh came too late for the broker.
        // Judged before reading them back: a broker that ended the token early may end the
        // reader's too.
        let links = sender.links_attached();
        if links > 1 {
            return Err(format!(
                "the sender's link was detached and replaced ({links} links attached) across \
                 the first token's life: the namespace ended a token before the client \
                 refreshed it (a shorter token life at the broker, or its clock \
                 ahead of this host's)"
            ));
        }
        let issued = refresh.tokens.issued_for(&audience);
        let refreshed_in_time = issued
            .iter()
            .skip(1)
            .find(|i| i.at < first.expires_at)
            .map(|i| i.at.duration_since(first.at).unwrap_or_default());
        self.read_back(queue, &ids, "the sender's messages").await?;
        match refreshed_in_time {
            Some(after) => Ok(format!(
                "token for {audience} refreshed {}s after the first, before its expiry at {}s; \
                 the sender worked after it",
                after.as_secs(),
                first
                    .expires_at
                    .duration_since(first.at)
                    .unwrap_or_default()
                    .as_secs()
            )),
            None => Err(format!(
                "no fresh token was asked for {audience} before the first expired ({} issued)",
                issued.len()
            )),
        }
    }

    /// Sends a message every [`TOKEN_BEAT`] for `wait`, so the sender's link is never idle
    /// (the service detaches a link idle for 10 minutes; an emulator's `--link-idle-timeout`
    /// may be seconds): a second link then means a detach for the token alone.
    async fn keep_sending(
        &self,
        sender: &sb_inbox::servicebus::ServiceBusSender,
        wait: Duration,
    ) -> Result<(), String> {
        let until = tokio::time::Instant::now() + wait;
        let mut beat = 0u32;
        while tokio::time::Instant::now() + TOKEN_BEAT < until {
            // The beat is the scenario's pace, not a wait for something to happen.
            tokio::time::sleep(TOKEN_BEAT).await;
            beat += 1;
            let id = format!("{}-token-beat-{beat}", self.prefix);
            sender
                .send(Message::new(id, "verify.token.v1", "{}"))
                .await
                .map_err(|e| format!("send {beat} while the token aged: {e}"))?;
        }
        tokio::time::sleep_until(until).await;
        Ok(())
    }

    /// Receives from `queue` until each of `ids` arrived, completing every delivery (another
    /// message of this run's is read past); the ids in their order of arrival.
    async fn read_back(
        &self,
        queue: &str,
        ids: &[String],
        what: &str,
    ) -> Result<Vec<String>, String> {
        let receiver = self.client.receiver(queue, 0);
        let mut got = Vec::new();
        let read = async {
            while got.len() < ids.len() {
                let delivery = receive_within(&receiver, DELIVERY_WAIT, what).await?;
                let id = delivery.client_delivery().message().message_id.clone();
                let id = id.unwrap_or_default();
                if ids.contains(&id) {
                    got.push(id);
                }
                delivery
                    .client_delivery()
                    .complete()
                    .await
                    .map_err(|e| format!("completing: {e}"))?;
            }
            Ok::<_, String>(())
        }
        .await;
        receiver.close().await;
        read.map(|()| got)
    }

    /// Messages of one session arrive in the order they were sent.
    async fn session_order(&self, queue: &str) -> Verdict {
        let session_id = format!("{}-s1", self.prefix);
        let mut sent = Vec::new();
        for i in 0..5 {
            let mut message = self.order(&format!("ord-{i}"), &format!("ord-{i}"))?;
            message.session_id = Some(session_id.clone());
            sent.push(message.message_id.clone().unwrap_or_default());
            self.send(queue, message).await?;
        }
        let session = self
            .client
            .accept_session(queue, &session_id)
            .await
            .map_err(|e| format!("accepting session {session_id} on {queue}: {e}"))?;
        let received = async {
            let mut received = Vec::new();
            while received.len() < sent.len() {
                match session.receive(DELIVERY_WAIT).await {
                    Ok(Some(delivery)) => {
                        received.push(delivery.message().message_id.clone().unwrap_or_default());
                        delivery
                            .complete()
                            .await
                            .map_err(|e| format!("completing in the session: {e}"))?;
                    }
                    Ok(None) => {
                        return Err(format!(
                            "{} of {} messages arrived in the session",
                            received.len(),
                            sent.len()
                        ));
                    }
                    Err(error) => return Err(format!("receiving in the session: {error}")),
                }
            }
            Ok(received)
        }
        .await;
        session.close().await;
        let received = received?;
        if received == sent {
            Ok(format!("{} messages in order", sent.len()))
        } else {
            Err(format!("sent {sent:?}, received {received:?}"))
        }
    }

    /// The handler's event is written to the outbox in its transaction and relayed once; a
    /// second relay pass publishes nothing, the row is marked dispatched (no backlog left),
    /// and the relayed message has the outbox row's id.
    async fn outbox_relayed_once(&self) -> Verdict {
        let queue = &self.entities.queue;
        let outbox = &self.entities.outbox;
        self.send(queue, self.order("out-1", "out")?).await?;
        let handler = OrderPlacedConsumer::new().with_events(outbox.clone());
        let (receiver, runtime) = self.runtime(queue, handler)?;
        let outcome = self.process_next(&receiver, &runtime, "the order").await;
        receiver.close().await;
        if outcome? != Outcome::Processed {
            return Err("the order was not processed".to_owned());
        }
        self.relay_twice().await?;
        let ids = self.read_events(outbox).await?;
        match ids.as_slice() {
            [(id, subject)] if subject == EVENT_CONTRACT && !id.is_empty() => {
                Ok(format!("one {EVENT_CONTRACT} relayed, message id {id}"))
            }
            other => Err(format!(
                "expected one {EVENT_CONTRACT} on {outbox}, received {other:?}"
            )),
        }
    }

    /// Two relay passes: one publish then none, and no row left pending.
    async fn relay_twice(&self) -> Result<(), String> {
        let relay = Relay::new(
            self.store.clone(),
            ServiceBusSenderPort::new(self.client.clone()),
            RelayConfig::default(),
        );
        let stop = CancellationToken::new();
        let first = relay
            .relay_once(&stop)
            .await
            .map_err(|e| format!("relaying: {e}"))?;
        let second = relay
            .relay_once(&stop)
            .await
            .map_err(|e| format!("relaying again: {e}"))?;
        if (first.published, second.published) != (1, 0) {
            return Err(format!(
                "expected one publish then none, got {} then {}",
                first.published, second.published
            ));
        }
        // The second pass found nothing because the row is leased; only its dispatch mark
        // keeps it from going out again once the lease ends.
        let pending = self
            .store
            .outbox_backlog()
            .await
            .map_err(|e| format!("reading the outbox backlog: {e}"))?
            .pending;
        if pending != 0 {
            return Err(format!(
                "{pending} outbox row(s) still pending after the relay published: the dispatch \
                 mark was not stored, so the event would be published again once its lease \
                 ends"
            ));
        }
        Ok(())
    }

    /// The events on `outbox`, each (message id, subject), read until it is quiet.
    async fn read_events(&self, outbox: &str) -> Result<Vec<(String, String)>, String> {
        let events = self.client.receiver(outbox, 0);
        let read = async {
            let mut ids = Vec::new();
            let wait = DELIVERY_WAIT;
            loop {
                let next = if ids.is_empty() {
                    wait
                } else {
                    Duration::from_secs(2)
                };
                match tokio::time::timeout(next, events.receive_message()).await {
                    Ok(Ok(Some(delivery))) => {
                        let m = delivery.message();
                        ids.push((
                            m.message_id.clone().unwrap_or_default(),
                            m.subject.clone().unwrap_or_default(),
                        ));
                        delivery
                            .complete()
                            .await
                            .map_err(|e| format!("completing the event: {e}"))?;
                    }
                    Ok(Ok(None)) | Err(_) => break,
                    Ok(Err(error)) => return Err(format!("receiving from {outbox}: {error}")),
                }
            }
            Ok(ids)
        }
        .await;
        events.close().await;
        read
    }
}

/// The next delivery of `receiver` within `wait`. A transient failure (a link the service
/// detached, a connection that dropped) is received through, as the runtime's receive loop
/// does: the receiver re-attaches on the next call.
async fn receive_within(
    receiver: &ServiceBusReceiver,
    wait: Duration,
    what: &str,
) -> Result<sb_inbox::servicebus::ServiceBusDelivery, String> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = None;
    loop {
        match tokio::time::timeout_at(deadline, receiver.receive()).await {
            Ok(Ok(Some(delivery))) => return Ok(delivery),
            Ok(Ok(None)) => return Err(format!("the receiver closed before {what}")),
            Ok(Err(error)) if error.is_transient() => {
                tracing::debug!(%error, "Receive failed transiently; receiving again.");
                last = Some(error.to_string());
                // A failure that repeats at once must not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(error)) => return Err(format!("receiving {what}: {error}")),
            Err(_) => {
                let last = last.map_or_else(String::new, |e| format!(" (last: {e})"));
                return Err(format!(
                    "{what} was not delivered within {}s{last}",
                    wait.as_secs()
                ));
            }
        }
    }
}

/// The reference consumer failing its first attempt transiently (a dependency that was down).
#[derive(Debug)]
struct FailFirst {
    inner: OrderPlacedConsumer,
    failed: std::sync::atomic::AtomicBool,
}

impl<T: InventoryTx> Handler<T> for FailFirst {
    type Payload = <OrderPlacedConsumer as Handler<T>>::Payload;

    fn contracts(&self) -> &[sb_inbox::Contract] {
        <OrderPlacedConsumer as Handler<T>>::contracts(&self.inner)
    }

    fn decode(
        &self,
        contract: &sb_inbox::Contract,
        body: &[u8],
    ) -> Result<Self::Payload, sb_inbox::DecodeError> {
        <OrderPlacedConsumer as Handler<T>>::decode(&self.inner, contract, body)
    }

    async fn handle(
        &self,
        ctx: &sb_inbox::Context<'_, Self::Payload>,
        tx: &mut T,
    ) -> Result<sb_inbox::Handled, HandlerError> {
        if !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(HandlerError::transient(
                "verify: the first attempt fails as a dependency that is down would",
            ));
        }
        self.inner.handle(ctx, tx).await
    }
}

/// Why a scenario did not run.
#[derive(Debug)]
pub struct Skip(pub String);

/// The median of `samples` in milliseconds.
fn median_ms(mut samples: Vec<Duration>) -> Option<f64> {
    samples.sort();
    samples
        .get(samples.len() / 2)
        .map(|d| d.as_secs_f64() * 1000.0)
}

/// Samples per measurement (after one warm-up).
const SAMPLES: usize = 9;

/// The broker's round trip (a peek: one `$management` request and answer) and the store's
/// commit (begin, one inbox row, commit), each the median of 9 samples after one warm-up.
pub async fn measure<S: Store>(
    client: &ServiceBusClient,
    queue: &str,
    store: &S,
    prefix: &str,
) -> Measurements {
    let mut rtts = Vec::new();
    for i in 0..=SAMPLES {
        let started = Instant::now();
        if client.peek(queue, 0, 1).await.is_err() {
            rtts.clear();
            break;
        }
        if i > 0 {
            rtts.push(started.elapsed());
        }
    }
    let consumer = format!("verify.{prefix}.latency");
    let mut commits = Vec::new();
    for i in 0..=SAMPLES {
        let started = Instant::now();
        let committed = async {
            let mut tx = store.begin().await?;
            tx.insert_inbox(&consumer, &format!("m-{i}")).await?;
            tx.commit().await
        }
        .await;
        if committed.is_err() {
            commits.clear();
            break;
        }
        if i > 0 {
            commits.push(started.elapsed());
        }
    }
    Measurements {
        broker_rtt_ms: median_ms(rtts),
        store_commit_ms: median_ms(commits),
        ..Measurements::default()
    }
    .derive()
}
