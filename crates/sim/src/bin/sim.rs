//! `sim --seeds N [--from S]` runs N seeds; `sim --seed S` replays one and prints its trace.
//! `SIM_FAULTS=net,broker,store,handler,clock` picks the fault kinds (all by default);
//! `--first` stops at the first failing seed. `--jobs N` runs the seeds in N processes at once
//! (each a `sim --seeds K --from S --tally` over a chunk of seeds, handed out as they finish):
//! one run is one thread, so this is how a many-core CI machine spends its cores.

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// Seeds per child process of `--jobs`: small enough that the last chunks end together, large
/// enough that starting a process (milliseconds) is lost in a chunk's seconds.
const CHUNK: u64 = 25;

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
        replay(seed, mix, &mix_name);
        return;
    }
    let seeds = value("--seeds").unwrap_or(100);
    let from = value("--from").unwrap_or(0);
    let first_only = args.iter().any(|a| a == "--first");
    if let Some(jobs) = value("--jobs").filter(|&jobs| jobs > 1) {
        let code = parallel(from, seeds, jobs, first_only, &mix_name);
        std::process::exit(code);
    }
    let tally = args.iter().any(|a| a == "--tally");
    let started = Instant::now();
    let mut failures = 0u64;
    let mut first: Option<u64> = None;
    let (mut virtual_secs, mut messages, mut again, mut early) = (0.0, 0usize, 0usize, 0u64);
    for seed in from..from + seeds {
        let report = sim::run(seed, mix);
        virtual_secs += report.virtual_time.as_secs_f64();
        messages += report.messages;
        again += report.outbox_again;
        early += report.retention_early;
        if !report.passed() {
            failures += 1;
            first.get_or_insert(seed);
            eprintln!("{}", report.explain(&mix_name));
            if first_only {
                if tally {
                    println!(
                        "tally {failures} {virtual_secs} {messages} {seed} {seed} {again} {early}"
                    );
                }
                println!(
                    "first failure at seed {seed} ({} seeds in)",
                    seed - from + 1
                );
                std::process::exit(1);
            }
            if report.violations.iter().any(|v| v.starts_with("hang:")) {
                // Its thread still spins and would slow every later seed.
                eprintln!("stopping after a hang at seed {seed}");
                if tally {
                    println!(
                        "tally {failures} {virtual_secs} {messages} {seed} {seed} {again} {early}"
                    );
                }
                std::process::exit(2);
            }
        }
    }
    if tally {
        let first = first.map_or("-".to_owned(), |s| s.to_string());
        let last = from + seeds - 1;
        println!("tally {failures} {virtual_secs} {messages} {first} {last} {again} {early}");
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds from {from} ({mix_name}): {failures} failed{}; {wall:.1} s wall ({:.1} s per 1000 seeds), {:.0} s virtual and {} messages per seed on average; {again} outbox rows relayed again (at-least-once), {early} inbox rows deleted by retention before a drain",
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

/// `--seed S`: runs one seed and prints its plan and trace; exits 1 when it failed.
fn replay(seed: u64, mix: sim::Mix, mix_name: &str) {
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
        eprintln!("{}", report.explain(mix_name));
        std::process::exit(1);
    }
}

/// What a child process of `--jobs` ran: its `tally` line.
#[derive(Default)]
struct Tally {
    failures: u64,
    virtual_secs: f64,
    messages: u64,
    first: Option<u64>,
    /// The last seed it ran (before the chunk's end when it stopped at a hang).
    last: u64,
    /// Outbox rows relayed again (at-least-once), over its seeds.
    again: u64,
    /// Inbox rows retention deleted before a drain (`retention`), over its seeds.
    early: u64,
}

impl Tally {
    fn parse(line: &str) -> Option<Tally> {
        let mut fields = line.strip_prefix("tally ")?.split_whitespace();
        Some(Tally {
            failures: fields.next()?.parse().ok()?,
            virtual_secs: fields.next()?.parse().ok()?,
            messages: fields.next()?.parse().ok()?,
            first: fields.next()?.parse().ok(),
            last: fields.next()?.parse().ok()?,
            again: fields.next().and_then(|a| a.parse().ok()).unwrap_or(0),
            early: fields.next().and_then(|a| a.parse().ok()).unwrap_or(0),
        })
    }
}

/// One running child: its chunk's end (exclusive) and the process.
struct Running {
    end: u64,
    child: Child,
}

/// Starts a child on seeds `start..end`; its stderr (the failing seeds' explanations) passes
/// through, its stdout is read for the tally.
fn spawn(start: u64, end: u64, first_only: bool) -> Option<Running> {
    let exe = std::env::current_exe().ok()?;
    let mut command = Command::new(exe);
    command
        .args([
            "--seeds",
            &(end - start).to_string(),
            "--from",
            &start.to_string(),
            "--tally",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if first_only {
        command.arg("--first");
    }
    let child = command.spawn().ok()?;
    Some(Running { end, child })
}

/// Waits for a child and reads its tally; a child that died without one counts as a failure of
/// its whole chunk.
fn reap(running: Running) -> (Tally, u64) {
    let Running { end, mut child } = running;
    let tally = child
        .stdout
        .take()
        .and_then(|out| {
            BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .find_map(|line| Tally::parse(&line))
        })
        .unwrap_or(Tally {
            failures: 1,
            last: end.saturating_sub(1),
            ..Tally::default()
        });
    let _ = child.wait();
    (tally, end)
}

/// The first child to exit, waiting for one (polled: a CLI's loop, not a test's timing).
fn finished(running: &mut Vec<Running>) -> Option<Running> {
    while !running.is_empty() {
        let done = running
            .iter_mut()
            .position(|r| !matches!(r.child.try_wait(), Ok(None)));
        if let Some(index) = done {
            return Some(running.swap_remove(index));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// `--jobs`: runs seeds `from..from + seeds` in `jobs` child processes, `CHUNK` seeds each,
/// handing out chunks as children finish; a chunk stopped by a hang goes on after the hung
/// seed in a new child. Prints the summary line of a one-process run; returns the exit code.
fn parallel(from: u64, seeds: u64, jobs: u64, first_only: bool, mix_name: &str) -> i32 {
    let started = Instant::now();
    let mut chunks: VecDeque<(u64, u64)> = (from..from + seeds)
        .step_by(CHUNK as usize)
        .map(|start| (start, (start + CHUNK).min(from + seeds)))
        .collect();
    let mut running: Vec<Running> = Vec::new();
    let mut total = Tally::default();
    while !chunks.is_empty() || !running.is_empty() {
        let stop = first_only && total.failures > 0;
        while running.len() < jobs as usize && !stop {
            let Some((start, end)) = chunks.pop_front() else {
                break;
            };
            match spawn(start, end, first_only) {
                Some(child) => running.push(child),
                None => {
                    eprintln!("could not start a child process for seeds {start}..{end}");
                    return 2;
                }
            }
        }
        let Some(done) = finished(&mut running) else {
            break;
        };
        let (tally, end) = reap(done);
        if tally.last + 1 < end && !first_only {
            chunks.push_back((tally.last + 1, end));
        }
        total.failures += tally.failures;
        total.virtual_secs += tally.virtual_secs;
        total.messages += tally.messages;
        total.again += tally.again;
        total.early += tally.early;
        total.first = match (total.first, tally.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds from {from} ({mix_name}, {jobs} jobs): {} failed{}; {wall:.1} s wall ({:.1} s per 1000 seeds), {:.0} s virtual and {} messages per seed on average; {} outbox rows relayed again (at-least-once), {} inbox rows deleted by retention before a drain",
        total.failures,
        total
            .first
            .map(|s| format!(", first at seed {s} ({} seeds in)", s - from + 1))
            .unwrap_or_default(),
        wall * 1000.0 / seeds.max(1) as f64,
        total.virtual_secs / seeds.max(1) as f64,
        total.messages / seeds.max(1),
        total.again,
        total.early
    );
    i32::from(total.failures > 0)
}
