//! The short fault campaign of every CI run (docs/reliability.md): a fixed seed's episodes of
//! faults against a 3-instance synchronous PostgreSQL cluster on process-backed pods under
//! write load, with the operator as a process of its own and the suite's object store. It
//! fails on any lost acknowledged row, any instant with two writable instances, a fault not
//! recovered from within the bound, differing checksums, a final backup that does not
//! restore every row, or a process left behind; the report names the seed and the timeline.
//! The long run is `cargo bench -p devctl-operator --bench campaign`.

mod support;

use std::time::Duration;

use devctl_testenv::S3Server;
use devctl_testenv::campaign::{self, Config, OperatorProcess, Plant, World, stats};

/// A seed whose twelve faults, in ten episodes, are of eleven of the twelve kinds (all but a
/// freeze, which the failover tests cover): four hit the primary (whole pod killed twice,
/// its engine killed, its partition from the API server beside a replica's pod deleted), one
/// restarts the API server during a scale 3 → 5 → 3.
const SEED: u64 = 4606;
const FAULTS: usize = 12;
/// The MariaDB round's seed and faults.
const MARIADB_SEED: u64 = 4606;
const MARIADB_FAULTS: usize = 6;

/// One campaign at a time in this binary: each restarts the API server or stops its store.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A world of its own (namespace, store, operator process) on the binary's cluster.
async fn world(prefix: &str, logs: &std::path::Path) -> World {
    support::databases::ensure_agent_built();
    let cluster = devctl_testenv::shared_process_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace(prefix).await.unwrap();
    // Its own store: the campaign stops it.
    let store: &'static S3Server = Box::leak(Box::new(S3Server::start().await.unwrap()));
    let operator = OperatorProcess::start(
        &support::operator_binary(),
        cluster.kubeconfig_path(),
        &namespace,
        logs,
    )
    .unwrap();
    World {
        cluster,
        store,
        client: cluster.client().await.unwrap(),
        namespace,
        operator,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_seeded_campaign_loses_no_row_never_has_two_writers_and_recovers_from_every_fault()
{
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = tempfile::tempdir().unwrap();
    let world = world("campaign", logs.path()).await;
    let mut config = Config::new(SEED, FAULTS);
    config.limits.shortest = Duration::from_secs(2);
    config.limits.longest = Duration::from_secs(6);
    let outcome = campaign::run(&world, &config).await.unwrap();
    println!("{}", stats::table(&stats::by_kind(&outcome.runs)));
    println!(
        "{} rows acknowledged in {:.0} s",
        outcome.acknowledged,
        outcome.took.as_secs_f64()
    );
    for run in &outcome.runs {
        println!("{run:?}");
    }
    println!("{}", outcome.verdict.report());
    let keep = logs.keep();
    assert!(
        outcome.verdict.passed(),
        "{}\noperator logs in {}",
        outcome.verdict.report(),
        keep.display()
    );
    let injected = outcome.runs.iter().filter(|r| r.skipped.is_none()).count();
    assert!(
        injected >= FAULTS,
        "only {injected} faults injected:\n{}",
        outcome.verdict.report()
    );
}

/// The MariaDB round (docs/mariadb.md): the same checkers against a 3-instance
/// semi-synchronous MariaDB cluster, fewer faults, a failover timeout short enough that the
/// primary's kill and partition fail over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_round_loses_no_row_never_has_two_writers_and_recovers_from_every_fault() {
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = tempfile::tempdir().unwrap();
    let world = world("campaign-maria", logs.path()).await;
    let mut config = Config::new(MARIADB_SEED, MARIADB_FAULTS);
    config.engine = devctl_api::database_cluster::Engine::Mariadb;
    config.name = "maria".into();
    // Shorter than its faults on the primary: they fail over.
    config.failover_timeout = Duration::from_secs(5);
    config.limits.shortest = Duration::from_secs(3);
    config.limits.longest = Duration::from_secs(9);
    let outcome = campaign::run(&world, &config).await.unwrap();
    println!("{}", stats::table(&stats::by_kind(&outcome.runs)));
    for run in &outcome.runs {
        println!("{run:?}");
    }
    println!("{}", outcome.verdict.report());
    let keep = logs.keep();
    assert!(
        outcome.verdict.passed(),
        "{}\noperator logs in {}",
        outcome.verdict.report(),
        keep.display()
    );
    assert!(outcome.acknowledged > 0);
}

/// A faultless run of cluster `name` in a namespace of `prefix` with `plant`, which must
/// fail: its outcome and report.
async fn planted(prefix: &str, name: &str, plant: Plant) -> (campaign::Outcome, String) {
    let _one = ONE_AT_A_TIME.lock().await;
    let logs = tempfile::tempdir().unwrap();
    let world = world(prefix, logs.path()).await;
    let mut config = Config::new(SEED, 0);
    config.name = name.into();
    config.final_restore = false;
    config.plant = Some(plant);
    let outcome = campaign::run(&world, &config).await.unwrap();
    let report = outcome.verdict.report();
    assert!(!outcome.verdict.passed(), "{report}");
    (outcome, report)
}

/// The checkers catch what they claim on a live cluster: a row acknowledged to the writer and
/// then deleted behind its back fails the run, and the report names the seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_fails_when_an_acknowledged_row_is_deleted_behind_the_writers_back() {
    let (outcome, report) = planted("campaign-plant", "plant", Plant::DeleteAcknowledgedRow).await;
    let failures = &outcome.verdict.failures;
    assert!(
        failures.len() == 1 && failures[0].starts_with("1 acknowledged rows lost: ["),
        "{report}"
    );
    assert!(report.contains(&format!("--seed {SEED}")), "{report}");
    assert!(report.contains("planted: acknowledged row"), "{report}");
}

/// The two-writer checker catches what it claims on a live cluster: a replica promoted
/// behind its agent's back accepts the prober's commits while the primary still does, until
/// its agent fences it; the run fails, naming the pair — and for nothing else: the fenced
/// instance rejoins and the cluster is Ready again within the bound. (Before the archive
/// refused such an engine's WAL, its timeline's history file reached the archive and every
/// standby start after, the rejoin and a re-clone alike, failed with "requested timeline 2
/// is not a child of this server's history": the run ended "not Ready at the end".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_fails_when_a_replica_is_promoted_behind_its_agents_back() {
    let (outcome, report) = planted(
        "campaign-split",
        "split",
        Plant::PromoteReplicaBehindItsAgent,
    )
    .await;
    let failures = &outcome.verdict.failures;
    assert!(
        failures
            .iter()
            .all(|f| f.contains(" were writable at once, from ")),
        "{report}"
    );
    assert!(
        report.contains("promoted behind its agent's back"),
        "{report}"
    );
    assert!(report.contains("stopped accepting writes"), "{report}");
}
