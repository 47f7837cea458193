//! `sim --seeds N [--from S]` runs N seeds; `sim --seed S` replays one and prints its trace.
//! `SIM_FAULTS=net,broker,store,handler,clock` picks the fault kinds (all by default);
//! `--first` stops at the first failing seed.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| -> Option<u64> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
    };
    let mix_name = std::env::var("SIM_FAULTS").unwrap_or_else(|_| "all".to_owned());
    let mix = sim::Mix::from_env();
    if let Some(seed) = value("--seed").or_else(|| std::env::var("SIM_SEED").ok()?.parse().ok()) {
        let report = sim::run(seed, mix);
        let plan = sim::Plan::new(seed, mix);
        println!(
            "plan: concurrency {}, prefetch {}, batch size {}, delayed retries {} ({} retries), handler {:?}, faults until {:?}, sent over {:?}, crashes (at, down) {:?}, worker {}, sessions (count, at once) {:?}",
            plan.concurrency,
            plan.prefetch,
            plan.batch_size,
            plan.delayed_retry,
            plan.retries,
            plan.handler,
            plan.faults_until,
            plan.send_over,
            plan.crashes,
            plan.worker,
            plan.sessions
        );
        for line in &report.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}: {} messages, {} faults, {:.0} s virtual, trace hash {:016x}",
            report.messages,
            report.faults,
            report.virtual_time.as_secs_f64(),
            report.trace_hash
        );
        if !report.passed() {
            eprintln!("{}", report.explain(&mix_name));
            std::process::exit(1);
        }
        return;
    }
    let seeds = value("--seeds").unwrap_or(100);
    let from = value("--from").unwrap_or(0);
    let started = Instant::now();
    let mut failures = 0u64;
    let mut first: Option<u64> = None;
    let (mut virtual_secs, mut messages) = (0.0, 0usize);
    for seed in from..from + seeds {
        let report = sim::run(seed, mix);
        virtual_secs += report.virtual_time.as_secs_f64();
        messages += report.messages;
        if !report.passed() {
            failures += 1;
            first.get_or_insert(seed);
            eprintln!("{}", report.explain(&mix_name));
            if args.iter().any(|a| a == "--first") {
                println!(
                    "first failure at seed {seed} ({} seeds in)",
                    seed - from + 1
                );
                std::process::exit(1);
            }
            if report.violations.iter().any(|v| v.starts_with("hang:")) {
                // Its thread still spins and would slow every later seed.
                eprintln!("stopping after a hang at seed {seed}");
                std::process::exit(2);
            }
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds from {from} ({mix_name}): {failures} failed{}; {wall:.1} s wall ({:.1} s per 1000 seeds), {:.0} s virtual and {} messages per seed on average",
        first
            .map(|s| format!(", first at seed {s} ({} seeds in)", s - from + 1))
            .unwrap_or_default(),
        wall * 1000.0 / seeds as f64,
        virtual_secs / seeds as f64,
        messages as u64 / seeds.max(1)
    );
    if failures > 0 {
        std::process::exit(1);
    }
}
