//! `sb-inbox-downstream <config.json>`: the service, until SIGTERM or Ctrl-C; then it drains
//! (every message in flight finishes and is settled) and prints its counters.

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: sb-inbox-downstream <config.json>")?;
    let telemetry = sb_inbox::telemetry::init_default()?;
    // Warns about misspelt `ORDERS_*` variables, naming the nearest setting.
    let config = sb_inbox::worker::WorkerConfig::load_from_env(Some(path.as_ref()), "ORDERS_")?;
    let stats = sb_inbox_downstream::serve_until_shutdown(config).await?;
    println!("{:?}", stats.total());
    tokio::task::spawn_blocking(move || telemetry.shutdown()).await?;
    Ok(())
}
