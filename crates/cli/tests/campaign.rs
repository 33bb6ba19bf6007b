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
use devctl_testenv::campaign::{self, Config, OperatorProcess, World, stats};

/// A seed whose twelve faults, in ten episodes, are of eleven of the twelve kinds (all but a
/// freeze, which the failover tests cover): four hit the primary (whole pod killed twice,
/// its engine killed, its partition from the API server beside a replica's pod deleted), one
/// restarts the API server during a scale 3 → 5 → 3.
const SEED: u64 = 4606;
const FAULTS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_seeded_campaign_loses_no_row_never_has_two_writers_and_recovers_from_every_fault()
{
    support::databases::ensure_agent_built();
    let cluster = devctl_testenv::shared_process_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("campaign").await.unwrap();
    // Its own store: the campaign stops it.
    let store: &'static S3Server = Box::leak(Box::new(S3Server::start().await.unwrap()));
    let logs = tempfile::tempdir().unwrap();
    let operator = OperatorProcess::start(
        &support::operator_binary(),
        cluster.kubeconfig_path(),
        &namespace,
        logs.path(),
    )
    .unwrap();
    let world = World {
        cluster,
        store,
        client: cluster.client().await.unwrap(),
        namespace,
        operator,
    };
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
