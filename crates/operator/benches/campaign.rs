//! The long fault campaign (docs/reliability.md): seeded episodes of faults against a
//! 3-instance synchronous PostgreSQL cluster on process-backed pods under write load, the
//! operator running as its own process, versitygw as the store. Prints the checkers' verdict,
//! and per fault kind the write unavailability and recovery time (Markdown, for the doc).
//!
//! `cargo build --release -p devctl-agent -p devctl-operator && cargo bench -p devctl-operator --bench campaign -- --faults 200 [--seed N] [--kinds KillPod,KillEngine,Switchover] [--target primary|replica] [--pair-one-in N] [--longest 20s] [--pause 60s]`
//!
//! Exits 1 when a checker failed; the report names the seed that replays the run.

use devctl_testenv::campaign::plan::{FaultKind, Target};
use devctl_testenv::campaign::{self, Config, OperatorProcess, World, stats};
use devctl_testenv::{Cluster, ClusterOptions, PodBacking, S3Server};

type BoxError = Box<dyn std::error::Error>;

/// Fixed work timed before and after the run (the machine's state, not the code's): CPU (a
/// hash loop) and the disk (64 synchronous 8 KiB writes, as commits are).
fn calibrate() -> Result<(f64, f64), BoxError> {
    use std::hash::{Hash, Hasher};
    use std::io::Write;
    let cpu = std::time::Instant::now();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for i in 0..20_000_000u64 {
        i.hash(&mut hasher);
    }
    std::hint::black_box(hasher.finish());
    let cpu = cpu.elapsed().as_secs_f64() * 1000.0;
    let dir = tempfile::tempdir()?;
    let mut file = std::fs::File::create(dir.path().join("fsync"))?;
    let disk = std::time::Instant::now();
    for _ in 0..64 {
        file.write_all(&[0u8; 8192])?;
        file.sync_data()?;
    }
    Ok((cpu, disk.elapsed().as_secs_f64() * 1000.0 / 64.0))
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let faults: usize = flag(&args, "--faults").map_or(Ok(200), |f| f.parse())?;
    let seed: u64 = match flag(&args, "--seed") {
        Some(seed) => seed.parse()?,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    };
    let mut config = Config::new(seed, faults);
    config.progress = true;
    if let Some(longest) = flag(&args, "--longest") {
        config.limits.longest = devctl_api::duration::parse(&longest)?;
    }
    if let Some(kinds) = flag(&args, "--kinds") {
        config.limits.kinds = kinds
            .split(',')
            .map(|k| FaultKind::from_name(k.trim()).ok_or(format!("no fault kind {k}")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(target) = flag(&args, "--target") {
        config.limits.target = Some(match target.as_str() {
            "primary" => Target::Primary,
            "replica" => Target::Replica,
            other => return Err(format!("--target is primary or replica, not {other}").into()),
        });
    }
    if let Some(pause) = flag(&args, "--pause") {
        config.pause = devctl_api::duration::parse(&pause)?;
    }
    if let Some(pairs) = flag(&args, "--pair-one-in") {
        config.limits.pair_one_in = pairs.parse()?;
    }
    let cluster: &'static Cluster = Box::leak(Box::new(
        Cluster::start_with(ClusterOptions {
            pods: PodBacking::processes()?,
            ..ClusterOptions::default()
        })
        .await?,
    ));
    cluster.install_crds(&devctl_api::crds()).await?;
    let namespace = cluster.create_namespace("campaign").await?;
    let store: &'static S3Server = Box::leak(Box::new(S3Server::start().await?));
    let logs = tempfile::Builder::new()
        .prefix("devctl-campaign-")
        .tempdir()?
        .keep();
    let operator = OperatorProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_devctl-operator")),
        cluster.kubeconfig_path(),
        &namespace,
        &logs,
    )?;
    let world = World {
        cluster,
        store,
        client: cluster.client().await?,
        namespace,
        operator,
    };
    println!(
        "campaign: seed {seed}, {faults} faults of {:?}, failoverTimeout {:?}, recovery bound {:?}",
        config.limits.kinds, config.failover_timeout, config.recovery_bound
    );
    let before = calibrate()?;
    let outcome = campaign::run(&world, &config).await?;
    let after = calibrate()?;
    println!(
        "calibration before / after: CPU {:.0} / {:.0} ms, fsync {:.2} / {:.2} ms",
        before.0, after.0, before.1, after.1
    );
    let runs = &outcome.runs;
    println!(
        "\n{} faults injected ({} skipped) in {} episodes, {:.0} s, {} rows acknowledged",
        runs.iter().filter(|r| r.skipped.is_none()).count(),
        runs.iter().filter(|r| r.skipped.is_some()).count(),
        runs.iter().map(|r| r.episode).max().map_or(0, |e| e + 1),
        outcome.took.as_secs_f64(),
        outcome.acknowledged
    );
    println!("\n{}", stats::table(&stats::by_kind(runs)));
    println!("{}", outcome.verdict.report());
    println!(
        "operator logs: {}; commit {}",
        logs.display(),
        std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    );
    if !outcome.verdict.passed() {
        std::process::exit(1);
    }
    Ok(())
}
