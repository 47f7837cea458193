//! `sb-inbox-downstream <config.json>`: the service, until Ctrl-C or SIGTERM.

use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: sb-inbox-downstream <config.json>")?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        // No signal handler means no graceful stop; the worker still runs.
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    let env = |name: &str| std::env::var(name).ok();
    let config = sb_inbox_downstream::load(path.as_ref(), &env)?;
    let stats = sb_inbox_downstream::serve(config, shutdown).await?;
    println!("{:?}", stats.total());
    Ok(())
}
