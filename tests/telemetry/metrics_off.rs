//! `OTEL_METRICS_EXPORTER=none` (issue 31): the Container Apps agent without a metrics
//! destination refuses metric exports, so the deployment turns the worker's metric exporter off.
//! A real `sb-inbox run` exporting to the in-process receiver then sends its spans and no
//! metric; the same run without the variable sends metrics, so the receiver would see them.

use std::time::Duration;

use crate::sink::Sink;
use crate::support::{cli, sqlite_file_store};

/// Spans and metrics the receiver got from one `sb-inbox run` that handled one order and was
/// stopped with SIGTERM (its exit flushes both pipelines).
async fn spans_and_metrics(tag: &str, metrics_exporter: Option<&str>) -> (usize, usize) {
    let (sink, addr) = Sink::start().await;
    let emulator = crate::emulator().await;
    let (dir, db) = sqlite_file_store(tag).await;
    let mut command = cli::worker(
        &format!("sqlite://{}", db.display()),
        &emulator.connection_string(),
    );
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("SB_INBOX_HEALTH_PORT", "0")
        .env("RUST_LOG", "warn")
        .stderr(std::process::Stdio::null());
    match metrics_exporter {
        Some(value) => command.env("OTEL_METRICS_EXPORTER", value),
        None => command.env_remove("OTEL_METRICS_EXPORTER"),
    };
    let child = command.spawn().unwrap();
    // Sent by a process of its own: this binary's other test counts the sends of our client in
    // its process-global meter.
    let sent = cli::run_async(
        Some(&emulator.connection_string()),
        &["send", "--entity", "orders", "--generate", "1"],
    )
    .await;
    assert!(sent.status.success(), "{}", cli::stderr(&sent));
    let entity = emulator.broker().entity("orders").unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while entity.counts().completed < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the worker completes the order");
    cli::sigterm_exits_0(child).await;
    let _ = std::fs::remove_dir_all(&dir);
    (sink.span_count(), sink.metrics().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_exports_spans_and_no_metric_with_the_metrics_exporter_none() {
    let (spans, metrics) = spans_and_metrics("metrics-on", None).await;
    assert!(spans > 0 && metrics > 0, "spans {spans}, metrics {metrics}");
    let (spans, metrics) = spans_and_metrics("metrics-off", Some("none")).await;
    assert!(spans > 0, "spans still go to the endpoint");
    assert_eq!(
        metrics, 0,
        "no metric export with OTEL_METRICS_EXPORTER=none"
    );
}
