//! The campaign against a live cluster: a 3-instance PostgreSQL cluster with synchronous
//! replication (`ANY 1`) and backups to the store, a writer committing one row at a time
//! through `-rw`, a prober asking every instance ten times a second whether it acknowledges a
//! commit, and the seed's episodes one after another. Between episodes the runner waits for
//! the cluster to be Ready again (within the recovery bound) and for writes to resume. At the
//! end: every acknowledged row on the final primary, every instance's checksum the same, a
//! final backup restored into a new cluster with every row, and no process left behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::{DatabaseCluster, FailoverRecord};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::checks::{Records, Recovery, Verdict};
use super::inject::{self, Ctx, FIRST_MINOR, MAJOR};
use super::plan::{self, Limits};
use super::probe::Prober;
use super::stats::{FaultRun, largest_gap};
use super::world::World;
use crate::workload::{self, Writer, reported_address};
use crate::{Error, eventually};

/// What a campaign runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    /// At least this many faults.
    pub faults: usize,
    pub limits: Limits,
    /// The cluster must be Ready (and writes resume) within this after an episode's last
    /// fault ended.
    pub recovery_bound: Duration,
    /// The cluster's `failoverTimeout`.
    pub failover_timeout: Duration,
    /// The cluster's name (the restore check makes `<name>-restored`).
    pub name: String,
    /// The writer's pause between rows.
    pub write_pause: Duration,
    /// Take a final backup and restore it into a new cluster.
    pub final_restore: bool,
    /// A failure planted on purpose, to show the checkers catch it.
    pub plant: Option<Plant>,
    /// Print the timeline on stderr as it goes.
    pub progress: bool,
    /// The engine: PostgreSQL, or a MariaDB round.
    pub engine: devctl_api::database_cluster::Engine,
    /// A quiet time after each episode recovered, before the next starts: faults further
    /// apart than the agent's crash-loop window (a minute) each meet a stable cluster.
    pub pause: Duration,
}

/// A failure the campaign must catch, planted by the runner itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// Once the writer stopped, the first acknowledged row is deleted on the primary behind
    /// its back (as a lost commit would look).
    DeleteAcknowledgedRow,
    /// After the episodes, while the writer still writes to the primary, a replica's engine
    /// is promoted behind its agent's back (as a split brain would look): it accepts writes
    /// until its agent notices and fences it.
    PromoteReplicaBehindItsAgent,
}

impl Config {
    /// The version the cluster starts at.
    pub fn version(&self) -> String {
        match self.engine {
            devctl_api::database_cluster::Engine::Mariadb => "10.11".into(),
            _ => format!("{MAJOR}.{FIRST_MINOR}"),
        }
    }

    /// How the writer, the prober and the checks log in as `app` with `password`.
    fn access(&self, dir: &Path, password: &str) -> Result<workload::Access, Error> {
        Ok(match self.engine {
            devctl_api::database_cluster::Engine::Mariadb => {
                workload::Access::Mariadb(password.to_string())
            }
            _ => workload::Access::Postgres(
                workload::app_passfile(dir, password)
                    .map_err(|e| Error::io("write the password file", e))?,
            ),
        })
    }

    pub fn new(seed: u64, faults: usize) -> Self {
        Self {
            seed,
            faults,
            limits: Limits::default(),
            recovery_bound: RECOVERY_BOUND,
            failover_timeout: Duration::from_secs(10),
            name: "camp".into(),
            write_pause: Duration::from_millis(20),
            final_restore: true,
            plant: None,
            progress: false,
            engine: devctl_api::database_cluster::Engine::Postgres,
            pause: Duration::ZERO,
        }
    }
}

/// The documented recovery bound (docs/reliability.md): two minutes after a fault ends. The
/// slowest recoveries are a re-clone of a replica and an operator whose leader Lease must
/// first run out; both take well under it.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(120);
/// Creating the cluster, the final backup and the restore.
const SETUP_BOUND: Duration = Duration::from_secs(240);
/// How long the status may lag a fault before the runner trusts a Ready it reads.
const SETTLE: Duration = Duration::from_secs(2);
/// Ready must hold this long to count.
const STEADY: Duration = Duration::from_secs(1);
/// How long replicas may take to catch up before their checksums are compared.
const CATCH_UP: Duration = Duration::from_secs(60);
/// How long a planted second writer stays writable at least (its agent held meanwhile).
const PLANT_HOLD: Duration = Duration::from_millis(1500);
/// How long processes may take to go once their cluster is deleted.
const TEARDOWN: Duration = Duration::from_secs(90);

/// What a run found and measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: Verdict,
    pub runs: Vec<FaultRun>,
    pub acknowledged: usize,
    pub took: Duration,
}

/// Runs the campaign `config` describes in `world`.
pub async fn run(world: &World, config: &Config) -> Result<Outcome, Error> {
    let name = config.name.as_str();
    store_secrets(world).await?;
    create_cluster(world, config).await?;
    let started = Instant::now();
    let started_wall = SystemTime::now();
    let mut ctx = Ctx::new(world, name, started, config.recovery_bound);
    ctx.progress = config.progress;
    ctx.engine = config.engine;
    ctx.note(format!(
        "campaign seed {} with {} faults",
        config.seed, config.faults
    ));
    wait_ready(&ctx, SETUP_BOUND).await?;
    let dir = tempfile::tempdir().map_err(|e| Error::io("a temporary directory", e))?;
    let passfile = config.access(dir.path(), &password(world, name).await?)?;
    let primary = ctx
        .cluster()
        .await
        .and_then(|d| d.status?.current_primary)
        .ok_or_else(|| Error::Process("the cluster has no primary".into()))?;
    sql(
        world,
        &passfile,
        &primary,
        "create table t (v bigint primary key, pod text)",
    )
    .await?;
    if config.engine == devctl_api::database_cluster::Engine::Mariadb {
        let table = format!(
            "create table {} (id int primary key, at bigint)",
            workload::MARIADB_PROBE_TABLE
        );
        sql(world, &passfile, &primary, &table).await?;
    }
    let writer = Writer::start_with(
        world.client.clone(),
        &world.namespace,
        name,
        passfile.clone(),
        1,
        config.write_pause,
    );
    eventually("the writer's first row", SETUP_BOUND, || async {
        (!writer.acks().is_empty()).then_some(())
    })
    .await?;
    let pods: Vec<String> = (0..5).map(|i| format!("{name}-{i}")).collect();
    let prober = Prober::start(
        &world.client,
        &world.namespace,
        &pods,
        passfile.clone(),
        started,
    );
    let mut failures = Vec::new();
    let mut records = Records::default();
    let mut runs = Vec::new();
    let mut last_record = ctx.cluster().await.and_then(|d| d.status?.last_failover);
    let since = |at: SystemTime| at.duration_since(started_wall).unwrap_or_default();
    for (index, episode) in plan::plan(config.seed, config.faults, &config.limits)
        .iter()
        .enumerate()
    {
        let begun = Instant::now();
        let alone = episode.faults.len() == 1;
        let mut episode_runs = futures::future::join_all(
            episode
                .faults
                .iter()
                .map(|fault| inject::run(&ctx, index, fault, alone, begun)),
        )
        .await;
        world.operator.check()?;
        let ended = started.elapsed();
        let took = wait_recovered(&ctx, config.recovery_bound).await;
        records.recoveries.push(Recovery {
            episode: index,
            took,
            bound: config.recovery_bound,
        });
        let Some(took) = took else {
            ctx.note(format!(
                "episode {index}: not Ready within {:?}; the campaign stops",
                config.recovery_bound
            ));
            runs.append(&mut episode_runs);
            break;
        };
        ctx.note(format!(
            "episode {index}: Ready {:.1} s after its faults ended",
            took.as_secs_f64()
        ));
        // Where a move's time went: the operator's flight record of it, once per move.
        let record = ctx.cluster().await.and_then(|d| d.status?.last_failover);
        if record.is_some() && record != last_record {
            if let Some(record) = &record {
                ctx.note(format!("episode {index}: {}", flight_record(record)));
            }
            last_record = record;
        }
        let ready_at = ended + took;
        let resumed = eventually(
            "a write after the recovery",
            config.recovery_bound,
            || async {
                writer
                    .acks()
                    .iter()
                    .map(|a| since(a.at))
                    .find(|at| *at > ready_at)
            },
        )
        .await;
        let Ok(resumed) = resumed else {
            failures.push(format!(
                "episode {index}: Ready, but no write acknowledged within {:?}",
                config.recovery_bound
            ));
            runs.append(&mut episode_runs);
            break;
        };
        let all = writer.acks();
        let acks: Vec<Duration> = all.iter().map(|a| since(a.at)).collect();
        // Recovered: Ready, and writes acknowledged again after the faults ended (a status
        // that never left Ready does not hide an outage).
        let written = acks
            .iter()
            .find(|at| **at > ended)
            .copied()
            .unwrap_or(resumed);
        let recovery = took.max(written.saturating_sub(ended));
        for run in &mut episode_runs {
            run.unavailable = largest_gap(&acks, run.at, resumed);
            run.recovery = Some(recovery);
        }
        let first = episode_runs.iter().map(|r| r.at).min().unwrap_or_default();
        let last_before = all.iter().rev().find(|a| since(a.at) <= first);
        let next = all.iter().find(|a| since(a.at) > first);
        ctx.note(format!(
            "episode {index}: writes: last before it {}, next {}, longest gap {:.2} s",
            describe(last_before, since),
            describe(next, since),
            episode_runs
                .iter()
                .filter_map(|r| r.unavailable)
                .max()
                .unwrap_or_default()
                .as_secs_f64()
        ));
        runs.append(&mut episode_runs);
        tokio::time::sleep(config.pause).await;
    }
    if config.plant == Some(Plant::PromoteReplicaBehindItsAgent) {
        promote_behind_the_agent(&ctx, config.recovery_bound).await?;
    }
    let acks = writer.finish().await;
    records.probes = prober.finish().await;
    ctx.note(format!("{} rows acknowledged", acks.len()));
    let acknowledged: Vec<i64> = acks.iter().map(|a| a.value).collect();
    if wait_recovered(&ctx, config.recovery_bound).await.is_some() {
        // Rows are compared only once they could be read from a primary that recovered.
        records.acknowledged = acknowledged;
        if config.plant == Some(Plant::DeleteAcknowledgedRow)
            && let Some(first) = acks.first()
            && let Some(primary) = ctx.cluster().await.and_then(|d| d.status?.current_primary)
        {
            let delete = format!("delete from t where v = {}", first.value);
            sql(world, &passfile, &primary, &delete).await?;
            ctx.note(format!(
                "planted: acknowledged row {} deleted on {primary}",
                first.value
            ));
        }
        final_checks(&ctx, &passfile, &mut records).await?;
        if config.final_restore {
            match restore_check(&ctx, config, dir.path(), &records.acknowledged).await {
                Ok(found) => failures.extend(found),
                Err(e) => failures.push(format!("the restore check failed: {e}")),
            }
        }
    } else {
        failures.push("the cluster was not Ready at the end".into());
    }
    failures.extend(teardown(&ctx, config).await);
    records.timeline = ctx.timeline.lock().map(|t| t.clone()).unwrap_or_default();
    let mut verdict = Verdict::of(config.seed, &records);
    verdict.failures.extend(failures);
    Ok(Outcome {
        verdict,
        runs,
        acknowledged: acks.len(),
        took: started.elapsed(),
    })
}

/// [`Plant::PromoteReplicaBehindItsAgent`]: promotes a replica's engine as its superuser,
/// without synchronous standbys (the primary's setting, which a clone copies, would hold its
/// commits back), and waits until its agent has stopped it accepting writes.
async fn promote_behind_the_agent(ctx: &Ctx<'_>, bound: Duration) -> Result<(), Error> {
    let world = ctx.world;
    let runner = world
        .cluster
        .pod_runner()
        .ok_or_else(|| Error::Process("the campaign needs process-backed pods".into()))?;
    let db = ctx.cluster().await;
    let instances = db.as_ref().map_or(3, |d| d.spec.replicas.max(1) as usize);
    let primary = db.and_then(|d| d.status?.current_primary);
    let replica = ctx
        .replicas(primary.as_deref(), instances)
        .into_iter()
        .next()
        .ok_or_else(|| Error::Process("no replica to promote".into()))?;
    for sql in [
        "alter system reset synchronous_standby_names",
        "select pg_reload_conf()",
    ] {
        runner
            .superuser_sql(&world.namespace, &replica, sql)
            .await?;
    }
    // Waits for the promotion to complete: `t` once the engine is out of recovery. (The
    // promotion needs the agent: it asks the archive for newer timelines through it.)
    let promoted = runner
        .superuser_sql(&world.namespace, &replica, "select pg_promote(true, 30)")
        .await;
    // Then its agent is held (SIGSTOP of the agent alone, not its engine) for PLANT_HOLD: a
    // probe of its own that happened to come right after the promotion would otherwise
    // fence the engine before the prober, at ten a second, had seen it writable, and the
    // plant would prove nothing.
    let agent = runner
        .agent_pids(&world.namespace, &replica)
        .first()
        .copied();
    if let (Ok("t"), Some(agent)) = (promoted.as_deref(), agent) {
        crate::process::continue_at_exit(&[agent]);
        // SAFETY: kill(2) with SIGSTOP on the agent the runner started; at worst ESRCH.
        unsafe {
            libc::kill(agent as libc::pid_t, libc::SIGSTOP);
        }
        tokio::time::sleep(PLANT_HOLD).await;
        // SAFETY: as above, SIGCONT.
        unsafe {
            libc::kill(agent as libc::pid_t, libc::SIGCONT);
        }
        crate::process::forget_stopped(&[agent]);
    }
    let promoted = promoted?;
    if promoted != "t" {
        return Err(Error::Process(format!(
            "pg_promote() on {replica} answered {promoted:?}"
        )));
    }
    let promoted = Instant::now();
    ctx.note(format!(
        "planted: {replica} promoted behind its agent's back while {} is the primary",
        primary.as_deref().unwrap_or("(none)")
    ));
    // Out of recovery until its agent stops it (or it is a standby again).
    eventually(
        &format!("{replica}'s agent to stop its promoted engine"),
        bound,
        || async {
            let answer = runner
                .superuser_sql(&world.namespace, &replica, "select pg_is_in_recovery()")
                .await;
            (answer.as_deref().ok() != Some("f")).then_some(())
        },
    )
    .await?;
    ctx.note(format!(
        "{replica} stopped accepting writes {:.1} s after it was promoted",
        promoted.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// A flight record as one line: each step's time after the one before.
fn flight_record(record: &FailoverRecord) -> String {
    use k8s_openapi::jiff::Timestamp;
    let at = |t: Option<&str>| t.and_then(|t| t.parse::<Timestamp>().ok());
    let detected = at(Some(&record.detected_at));
    let steps = [
        ("last seen", at(record.primary_last_seen_at.as_deref())),
        ("detected", detected),
        ("elected", at(record.elected_at.as_deref())),
        ("promoted", at(record.promoted_at.as_deref())),
        ("switched", at(record.service_switched_at.as_deref())),
    ];
    let mut line = format!(
        "flight record {:?} {} -> {}:",
        record.reason,
        record.failed_primary,
        record.new_primary.as_deref().unwrap_or("-")
    );
    let mut before: Option<Timestamp> = None;
    for (step, time) in steps {
        let Some(time) = time else { continue };
        match before {
            Some(b) => line.push_str(&format!(
                " {step} +{:.3} s",
                time.duration_since(b).as_secs_f64()
            )),
            None => line.push_str(&format!(" {step}")),
        }
        before = Some(time);
    }
    line
}

fn describe(ack: Option<&workload::Ack>, since: impl Fn(SystemTime) -> Duration) -> String {
    ack.map_or("none".into(), |a| {
        format!(
            "row {} by {} at {:.3} s",
            a.value,
            a.pod,
            since(a.at).as_secs_f64()
        )
    })
}

/// The store's credentials and CA as Secrets in the campaign's namespace.
async fn store_secrets(world: &World) -> Result<(), Error> {
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    for secret in [
        json!({ "metadata": { "name": "s3-credentials" }, "stringData": {
            "accessKeyId": world.store.access_key_id(),
            "secretAccessKey": world.store.secret_access_key(),
        } }),
        json!({ "metadata": { "name": "s3-ca" }, "stringData": { "ca.crt": world.store.ca_pem() } }),
    ] {
        let secret: Secret =
            serde_json::from_value(secret).map_err(|e| Error::Process(format!("a Secret: {e}")))?;
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::Process(format!("creating a store Secret: {e}"))),
        }
    }
    Ok(())
}

fn backup_spec(world: &World) -> serde_json::Value {
    json!({
        "enabled": true,
        "destination": {
            "endpoint": world.store.endpoint(),
            "bucket": world.store.bucket(),
            "path": "campaign",
            "credentialsSecret": "s3-credentials",
            "caSecret": "s3-ca",
        },
    })
}

async fn create(world: &World, name: &str, spec: serde_json::Value) -> Result<(), Error> {
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name }, "spec": spec,
    }))
    .map_err(|e| Error::Process(format!("the cluster's spec: {e}")))?;
    Api::<DatabaseCluster>::namespaced(world.client.clone(), &world.namespace)
        .create(&PostParams::default(), &db)
        .await
        .map_err(|e| Error::Process(format!("creating cluster {name}: {e}")))?;
    Ok(())
}

async fn create_cluster(world: &World, config: &Config) -> Result<(), Error> {
    create(
        world,
        &config.name,
        json!({
            "engine": config.engine, "version": config.version(), "replicas": 3,
            "storage": { "size": "1Gi" },
            "backup": backup_spec(world),
            "replication": { "synchronous": { "method": "any", "number": 1 } },
            "highAvailability": {
                "enabled": true,
                "failoverTimeout": format!("{}s", config.failover_timeout.as_secs()),
            },
        }),
    )
    .await
}

async fn password(world: &World, name: &str) -> Result<String, Error> {
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), &world.namespace);
    let secret = eventually("the cluster's credentials", SETUP_BOUND, || async {
        secrets
            .get_opt(&format!("{name}-credentials"))
            .await
            .ok()
            .flatten()
    })
    .await?;
    secret
        .data
        .and_then(|d| {
            d.get("password")
                .map(|p| String::from_utf8_lossy(&p.0).to_string())
        })
        .ok_or_else(|| Error::Process(format!("{name}-credentials has no password")))
}

async fn sql(
    world: &World,
    access: &workload::Access,
    pod: &str,
    sql: &str,
) -> Result<String, Error> {
    let address = reported_address(&world.client, &world.namespace, pod)
        .await
        .ok_or_else(|| Error::Process(format!("{pod} reports no address")))?;
    workload::sql_at(access, &address, sql)
        .await
        .map_err(|e| Error::Process(format!("on {pod}: {sql}: {e}")))
}

/// Whether `db` is Ready with every instance, no move under way, its spec observed.
fn ready(db: &DatabaseCluster) -> bool {
    let Some(status) = db.status.as_ref() else {
        return false;
    };
    status.observed_generation == db.metadata.generation
        && status.ready_replicas == db.spec.replicas
        && status.target_primary.is_none()
        && status.current_primary.is_some()
        && devctl_api::conditions::find(&status.conditions, "Ready")
            .is_some_and(|c| c.status == "True")
}

async fn wait_ready(ctx: &Ctx<'_>, bound: Duration) -> Result<(), Error> {
    eventually(
        &format!("cluster {} to be Ready", ctx.name),
        bound,
        || async { ctx.cluster().await.filter(ready).map(|_| ()) },
    )
    .await
}

/// How long after now (minus nothing: the faults just ended) the cluster was Ready and stayed
/// so for [`STEADY`]; `None` when not within `bound`. The first look comes [`SETTLE`] after
/// the faults ended, so a Ready the operator has not yet taken back does not count.
async fn wait_recovered(ctx: &Ctx<'_>, bound: Duration) -> Option<Duration> {
    let ended = Instant::now();
    tokio::time::sleep(SETTLE).await;
    let mut ready_since: Option<Instant> = None;
    while ended.elapsed() <= bound {
        let now = Instant::now();
        match (ctx.cluster().await.is_some_and(|d| ready(&d)), ready_since) {
            (true, Some(since)) if now.duration_since(since) >= STEADY => {
                return Some(since.duration_since(ended));
            }
            (true, None) => ready_since = Some(now),
            (true, Some(_)) => {}
            (false, _) => ready_since = None,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// The rows of `t` on `pod`, and their checksum.
async fn rows_on(
    world: &World,
    passfile: &workload::Access,
    pod: &str,
) -> Result<(BTreeSet<i64>, String), Error> {
    let out = sql(world, passfile, pod, "select v from t order by v").await?;
    let rows = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    Ok((rows, format!("{:x}", fingerprint(&out))))
}

/// A cheap fingerprint of a table dump (the rows are compared exactly through it).
fn fingerprint(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// The rows on the final primary and every instance's checksum once the replicas caught up
/// (or [`CATCH_UP`] passed).
async fn final_checks(
    ctx: &Ctx<'_>,
    passfile: &workload::Access,
    records: &mut Records,
) -> Result<(), Error> {
    let world = ctx.world;
    let db = ctx
        .cluster()
        .await
        .ok_or_else(|| Error::Process("the cluster is gone".into()))?;
    let primary = db
        .status
        .as_ref()
        .and_then(|s| s.current_primary.clone())
        .ok_or_else(|| Error::Process("the cluster has no primary".into()))?;
    let (present, reference) = rows_on(world, passfile, &primary).await?;
    records.present = present;
    records.primary = primary.clone();
    let pods: Vec<String> = (0..db.spec.replicas)
        .map(|i| format!("{}-{i}", ctx.name))
        .collect();
    let caught_up = Instant::now();
    loop {
        let mut checksums = BTreeMap::new();
        for pod in pods.iter().filter(|p| **p != primary) {
            let sum = match rows_on(world, passfile, pod).await {
                Ok((_, sum)) => sum,
                Err(e) => format!("unreadable: {e}"),
            };
            checksums.insert(pod.clone(), sum);
        }
        let agree = checksums.values().all(|s| *s == reference);
        records.checksums = checksums;
        records.checksums.insert(primary.clone(), reference.clone());
        if agree || caught_up.elapsed() > CATCH_UP {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A final backup restored into `<name>-restored`; the failures it found.
async fn restore_check(
    ctx: &Ctx<'_>,
    config: &Config,
    dir: &Path,
    acknowledged: &[i64],
) -> Result<Vec<String>, Error> {
    let world = ctx.world;
    let backups: Api<DatabaseBackup> = Api::namespaced(world.client.clone(), &world.namespace);
    let backup_name = format!("{}-final", config.name);
    let backup: DatabaseBackup = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
        "metadata": { "name": backup_name }, "spec": { "cluster": { "name": config.name } },
    }))
    .map_err(|e| Error::Process(format!("the backup: {e}")))?;
    backups
        .create(&PostParams::default(), &backup)
        .await
        .map_err(|e| Error::Process(format!("creating the final backup: {e}")))?;
    ctx.note("final backup requested");
    let phase = eventually("the final backup to finish", SETUP_BOUND, || async {
        let phase = backups.get_opt(&backup_name).await.ok()??.status?.phase?;
        matches!(phase, BackupPhase::Completed | BackupPhase::Failed).then_some(phase)
    })
    .await?;
    if phase != BackupPhase::Completed {
        return Ok(vec![format!("the final backup ended {}", phase.as_str())]);
    }
    ctx.note("final backup completed; restoring it");
    let restored = format!("{}-restored", config.name);
    // The source's version (rolling updates moved it up; a restore never goes down).
    let version = ctx
        .cluster()
        .await
        .map_or_else(|| config.version(), |d| d.spec.version);
    create(
        world,
        &restored,
        json!({
            "engine": config.engine, "version": version, "replicas": 1,
            "storage": { "size": "1Gi" },
            "backup": { "enabled": false },
            "bootstrap": { "recovery": { "backup": backup_name } },
        }),
    )
    .await?;
    let dbs: Api<DatabaseCluster> = Api::namespaced(world.client.clone(), &world.namespace);
    eventually("the restored cluster to be Ready", SETUP_BOUND, || async {
        dbs.get_opt(&restored)
            .await
            .ok()
            .flatten()
            .filter(ready)
            .map(|_| ())
    })
    .await?;
    // The restored cluster has credentials of its own.
    let restored_dir = dir.join("restored");
    std::fs::create_dir_all(&restored_dir)
        .map_err(|e| Error::io(format!("create {}", restored_dir.display()), e))?;
    let passfile = config.access(&restored_dir, &password(world, &restored).await?)?;
    let (rows, _) = rows_on(world, &passfile, &format!("{restored}-0")).await?;
    ctx.note(format!("restored {} rows", rows.len()));
    let lost = super::checks::lost_rows(acknowledged, &rows);
    Ok(if lost.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "the restored final backup lacks {} acknowledged rows: {:?}",
            lost.len(),
            &lost[..lost.len().min(20)]
        )]
    })
}

/// Deletes the campaign's clusters and checks that their processes went; the failures.
async fn teardown(ctx: &Ctx<'_>, config: &Config) -> Vec<String> {
    let world = ctx.world;
    let dbs: Api<DatabaseCluster> = Api::namespaced(world.client.clone(), &world.namespace);
    let names = [config.name.clone(), format!("{}-restored", config.name)];
    for name in &names {
        let _ = dbs.delete(name, &DeleteParams::default()).await;
    }
    let Ok(runner) = world.runner() else {
        return vec!["no pod runner".into()];
    };
    let pods: Vec<String> = names
        .iter()
        .flat_map(|n| (0..5).map(move |i| format!("{n}-{i}")))
        .collect();
    let claims = runner.root().join("claims").join(&world.namespace);
    let gone = eventually("the campaign's processes to go", TEARDOWN, || async {
        let agents: Vec<&String> = pods
            .iter()
            .filter(|p| runner.pid(&world.namespace, p).is_some())
            .collect();
        (agents.is_empty() && processes_under(&claims).is_empty()).then_some(())
    })
    .await;
    match gone {
        Ok(()) => Vec::new(),
        Err(_) => vec![format!(
            "processes left behind after the clusters were deleted: {:?}",
            processes_under(&claims)
        )],
    }
}

/// Processes whose command line names a path under `dir` (an engine's data directory).
fn processes_under(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| crate::process::is_running(*pid))
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(&needle).then_some((pid, cmdline))
        })
        .collect()
}
