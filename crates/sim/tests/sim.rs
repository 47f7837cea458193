//! The simulator's own tests: one seed replays bit for bit, a few seeds pass. Larger runs
//! are the `sim` binary's (`cargo run --release -p sim -- --seeds 500`) or `SIM_SEEDS=N`.

#[test]
fn one_seed_twice_gives_the_same_trace() {
    let seed = std::env::var("SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let first = sim::run(seed, sim::Mix::ALL);
    let second = sim::run(seed, sim::Mix::ALL);
    assert!(first.trace.len() > 100, "{:?}", first.trace);
    if first.trace_hash != second.trace_hash {
        let diverged = first
            .trace
            .iter()
            .zip(&second.trace)
            .position(|(a, b)| a != b)
            .unwrap_or(first.trace.len().min(second.trace.len()));
        panic!(
            "seed {seed} diverged at event {diverged}:\n  first:  {:?}\n  second: {:?}",
            first.trace.get(diverged),
            second.trace.get(diverged)
        );
    }
}

#[test]
fn seeds_pass() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut failed = Vec::new();
    for seed in 1000..1000 + seeds {
        let report = sim::run(seed, sim::Mix::ALL);
        assert!(report.messages >= 200);
        assert!(report.virtual_time >= std::time::Duration::from_secs(60));
        if !report.passed() {
            eprintln!("{}", report.explain("all"));
            failed.push(seed);
        }
    }
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}
