//! `devctl db create|list|status|shell|promote|credentials|delete`.

use std::time::Duration;

use clap::Subcommand;
use devctl_api::conditions;
use devctl_api::database_backup::{BackupPhase, DatabaseBackup};
use devctl_api::database_cluster::{
    DatabaseCluster, Engine, FINALIZER, KEEP_VOLUMES_ANNOTATION, keeps_volumes,
};
use devctl_api::instance::{FORCE_FAILOVER_ANNOTATION, SWITCHOVER_ANNOTATION};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::{self, Connection, GlobalArgs};
use crate::output::{self, table};
use crate::wait;

#[derive(Subcommand)]
pub enum DbCommand {
    /// Create a database cluster.
    Create {
        name: String,
        /// Database engine.
        #[arg(long, value_enum, default_value_t = EngineArg::Postgres)]
        engine: EngineArg,
        /// Engine version as major.minor, e.g. 16.2.
        #[arg(long)]
        version: String,
        /// Number of instances (1-7).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=7))]
        replicas: i32,
        /// Volume size per instance, e.g. 10Gi.
        #[arg(long, default_value = "10Gi")]
        storage: String,
        /// Storage class (the cluster's default when unset).
        #[arg(long)]
        storage_class: Option<String>,
        /// Wait until the cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// List database clusters.
    List {
        /// List across all namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
    },
    /// Show a cluster's phase, conditions, endpoints, pods and recent events.
    Status { name: String },
    /// Open the engine's client (psql, mariadb) as the app user on the primary, or on the
    /// instance named by --instance. Arguments after `--` go to the client; `-c SQL` runs one
    /// statement with either engine.
    Shell {
        name: String,
        /// The pod of the instance to connect to (default: the primary).
        #[arg(long)]
        instance: Option<String>,
        /// Arguments for the client, after `--`.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Switch the primary to another instance (a planned switchover: the primary
    /// checkpoints and stops, the target promotes once it has all of its WAL, nothing is
    /// lost; the old primary rejoins as a standby). When the primary is lost, a failover to
    /// POD instead: at once when its lock expired with automatic failover off; with --force
    /// when no lock proves it (high availability off) and it does not serve.
    Promote {
        name: String,
        /// The pod of the replica to promote, e.g. NAME-1.
        pod: String,
        /// Allow a failover to POD when the primary does not serve and no primary lock proves
        /// it lost (without high availability): what the primary had not sent to POD is lost.
        #[arg(long)]
        force: bool,
        /// Wait until POD is the primary and the cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Back a cluster up now: creates a DatabaseBackup NAME-<time> and, with --wait, follows
    /// it to Completed (exit 1 when it fails).
    Backup {
        name: String,
        /// Which instance: a streaming `replica` (the default when one streams) or the
        /// `primary`.
        #[arg(long, value_enum)]
        target: Option<TargetArg>,
        /// Wait until the backup completes or fails.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "30m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Restore a backup into a NEW cluster (never over a running one), optionally to a point
    /// in time (PostgreSQL). The new cluster copies the source cluster's spec when it exists.
    Restore {
        /// The new cluster's name.
        name: String,
        /// The DatabaseBackup to restore.
        #[arg(long)]
        from: String,
        /// Replay WAL up to this time (RFC 3339, e.g. 2026-11-30T12:00:00Z).
        #[arg(long)]
        to: Option<String>,
        /// Wait until the new cluster is Ready.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "30m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Show how to connect (password masked unless --show-password).
    Credentials {
        name: String,
        #[arg(long)]
        show_password: bool,
    },
    /// Delete a database cluster with its volumes (--keep-volumes keeps its data).
    Delete {
        name: String,
        /// Keep the cluster's PersistentVolumeClaims (its data) after it is gone: sets the
        /// db.devctl.io/keep-volumes annotation before deleting.
        #[arg(long)]
        keep_volumes: bool,
        /// Wait until it is gone.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "5m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TargetArg {
    Replica,
    Primary,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum EngineArg {
    Postgres,
    Mysql,
}

pub async fn run(global: &GlobalArgs, command: DbCommand) -> anyhow::Result<()> {
    let connection = cluster::connect(global).await?;
    let api: Api<DatabaseCluster> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    match command {
        DbCommand::Create {
            name,
            engine,
            version,
            replicas,
            storage,
            storage_class,
            wait,
            timeout,
        } => {
            let engine = match engine {
                EngineArg::Postgres => Engine::Postgres,
                EngineArg::Mysql => Engine::Mysql,
            };
            let mut storage_spec = json!({ "size": storage });
            if let Some(class) = storage_class {
                storage_spec["storageClassName"] = json!(class);
            }
            let db: DatabaseCluster = serde_json::from_value(json!({
                "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
                "metadata": { "name": name },
                "spec": { "engine": engine, "version": version, "replicas": replicas, "storage": storage_spec }
            }))?;
            api.create(&PostParams::default(), &db).await.map_err(|e| {
                cluster::explain(
                    e,
                    &format!("creating databasecluster {name}"),
                    &connection.server,
                )
            })?;
            println!("databasecluster {}/{name} created", connection.namespace);
            if wait {
                eprintln!("Waiting for {name} to be Ready...");
                wait::until(&api, &name, timeout, progress, is_ready).await?;
                println!("databasecluster {name} is Ready");
            }
            Ok(())
        }
        DbCommand::List { all_namespaces } => {
            let header = [
                "NAME", "ENGINE", "VERSION", "REPLICAS", "READY", "PHASE", "AGE",
            ];
            super::list(
                &connection,
                global.output,
                all_namespaces,
                "databaseclusters",
                &header,
                |db: &DatabaseCluster| {
                    let status = db.status.clone().unwrap_or_default();
                    vec![
                        db.name_any(),
                        db.spec.engine.to_string(),
                        db.spec.version.clone(),
                        db.spec.replicas.to_string(),
                        status.ready_replicas.to_string(),
                        status
                            .phase
                            .map(|p| p.as_str().to_string())
                            .unwrap_or_default(),
                        output::age(db.metadata.creation_timestamp.as_ref()),
                    ]
                },
            )
            .await
        }
        DbCommand::Status { name } => status(global, &connection, &api, &name).await,
        DbCommand::Shell {
            name,
            instance,
            args,
        } => {
            let code =
                super::shell::shell(&connection, &api, &name, instance.as_deref(), &args).await?;
            if code != 0 {
                // The client's own exit code, after its password file is gone.
                std::process::exit(code);
            }
            Ok(())
        }
        DbCommand::Promote {
            name,
            pod,
            force,
            wait,
            timeout,
        } => promote(&connection, &api, &name, &pod, force, wait, timeout).await,
        DbCommand::Credentials {
            name,
            show_password,
        } => credentials(global, &connection, &api, &name, show_password).await,
        DbCommand::Backup {
            name,
            target,
            wait,
            timeout,
        } => backup(&connection, &api, &name, target, wait, timeout).await,
        DbCommand::Restore {
            name,
            from,
            to,
            wait,
            timeout,
        } => {
            restore(
                &connection,
                &api,
                &name,
                &from,
                to.as_deref(),
                wait,
                timeout,
            )
            .await
        }
        DbCommand::Delete {
            name,
            keep_volumes,
            wait,
            timeout,
        } => {
            if keep_volumes {
                let patch =
                    json!({ "metadata": { "annotations": { KEEP_VOLUMES_ANNOTATION: "true" } } });
                let marked = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map_err(|e| {
                        cluster::explain(
                            e,
                            &format!("marking databasecluster {name} to keep its volumes"),
                            &connection.server,
                        )
                    })?;
                if marked.metadata.deletion_timestamp.is_some() {
                    eprintln!(
                        "warning: databasecluster {name} was already being deleted; its volumes may be deleted already"
                    );
                }
            }
            let deleted = api
                .delete(&name, &DeleteParams::default())
                .await
                .map_err(|e| {
                    cluster::explain(
                        e,
                        &format!("deleting databasecluster {name}"),
                        &connection.server,
                    )
                })?;
            // The object as the deletion left it: still there while the operator's finalizer
            // cleans up, which is what deletes the volumes (or keeps them, as annotated).
            let volumes = match deleted.left() {
                Some(db) if keeps_volumes(db.annotations()) => " (its volumes are kept)",
                Some(db)
                    if db.finalizers().iter().any(|f| f == FINALIZER)
                        && db.spec.backup.as_ref().is_some_and(|b| b.final_backup) =>
                {
                    " (its volumes are deleted after its final backup, kept if that does not complete)"
                }
                Some(db) if db.finalizers().iter().any(|f| f == FINALIZER) => {
                    " (its volumes are deleted with it)"
                }
                _ => "",
            };
            println!(
                "databasecluster {}/{name} deleted{volumes}",
                connection.namespace
            );
            if wait {
                wait::until_deleted(&api, &name, timeout).await?;
            }
            Ok(())
        }
    }
}

fn backup_progress(backup: Option<&DatabaseBackup>) -> String {
    let Some(backup) = backup else {
        return "not found".into();
    };
    let status = backup.status.clone().unwrap_or_default();
    let phase = status.phase.map(|p| p.as_str()).unwrap_or("Pending");
    let mut line = format!("phase {phase}");
    if let Some(instance) = &status.instance {
        line.push_str(&format!(", on {instance}"));
    }
    if let Some(size) = status.size {
        line.push_str(&format!(", {size} bytes"));
    }
    if let Some(message) = &status.message {
        line.push_str(&format!(": {message}"));
    }
    line
}

async fn backup(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    target: Option<TargetArg>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    get(connection, api, name).await?;
    let backups: Api<DatabaseBackup> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d%H%M%S");
    let mut spec = json!({ "cluster": { "name": name } });
    if let Some(target) = target {
        spec["target"] = json!(match target {
            TargetArg::Replica => "replica",
            TargetArg::Primary => "primary",
        });
    }
    // Named by the time, like scheduled backups (so they sort together); a name taken in the
    // same second (another `db backup`, or a scheduled run) gets a counter instead of an error.
    let mut backup_name = format!("{name}-{stamp}");
    for attempt in 2.. {
        let object: DatabaseBackup = serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseBackup",
            "metadata": {
                "name": backup_name,
                // As on the backups the operator creates (scheduled, final), so
                // `kubectl get dbb -l db.devctl.io/cluster=NAME` lists them all.
                "labels": { devctl_operator::database_cluster::backup_lifecycle::CLUSTER_LABEL: name },
            },
            "spec": spec,
        }))?;
        match backups.create(&PostParams::default(), &object).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempt <= 9 => {
                backup_name = format!("{name}-{stamp}-{attempt}");
            }
            Err(e) => {
                return Err(cluster::explain(
                    e,
                    &format!("creating databasebackup {backup_name}"),
                    &connection.server,
                ));
            }
        }
    }
    println!(
        "databasebackup {}/{backup_name} created",
        connection.namespace
    );
    if !wait {
        return Ok(());
    }
    wait::until(&backups, &backup_name, timeout, backup_progress, |b| {
        b.and_then(|b| b.status.as_ref())
            .and_then(|s| s.phase)
            .is_some_and(BackupPhase::is_final)
    })
    .await?;
    let done = backups.get(&backup_name).await?;
    let status = done.status.unwrap_or_default();
    match status.phase {
        Some(BackupPhase::Completed) => {
            println!(
                "databasebackup {backup_name} Completed: {} bytes at {}",
                status.size.unwrap_or(0),
                status.object_path.unwrap_or_default()
            );
            Ok(())
        }
        _ => anyhow::bail!(
            "databasebackup {backup_name} failed: {}",
            status.message.unwrap_or_else(|| "no reason given".into())
        ),
    }
}

#[allow(clippy::too_many_arguments)]
async fn restore(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    from: &str,
    to: Option<&str>,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let backups: Api<DatabaseBackup> =
        Api::namespaced(connection.client.clone(), &connection.namespace);
    let backup = backups.get_opt(from).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading databasebackup {from}"),
            &connection.server,
        )
    })?;
    let Some(backup) = backup else {
        anyhow::bail!(
            "databasebackup {from} not found in namespace {}",
            connection.namespace
        );
    };
    let status = backup.status.clone().unwrap_or_default();
    if status.phase != Some(BackupPhase::Completed) {
        anyhow::bail!(
            "databasebackup {from} is {}, not Completed: only a completed backup can be restored",
            status.phase.map(|p| p.as_str()).unwrap_or("Pending")
        );
    }
    if api.get_opt(name).await?.is_some() {
        anyhow::bail!(
            "databasecluster {name} already exists: a restore creates a new cluster, never overwrites one"
        );
    }
    // The source's spec when it still exists (engine, version, size, instances, backups).
    let source = api.get_opt(&backup.spec.cluster.name).await?;
    let mut spec = match &source {
        Some(db) => serde_json::to_value(&db.spec)?,
        None => json!({
            "engine": status.engine.clone().unwrap_or_else(|| "postgres".into()),
            "version": status.version.clone().unwrap_or_default(),
            "storage": { "size": "10Gi" },
        }),
    };
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("bootstrap");
    }
    let mut recovery = json!({ "backup": from });
    if let Some(to) = to {
        recovery["targetTime"] = json!(to);
    }
    spec["bootstrap"] = json!({ "recovery": recovery });
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": name }, "spec": spec,
    }))?;
    api.create(&PostParams::default(), &db).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("creating databasecluster {name}"),
            &connection.server,
        )
    })?;
    println!(
        "databasecluster {}/{name} created from databasebackup {from}{}",
        connection.namespace,
        to.map(|t| format!(" (to {t})")).unwrap_or_default()
    );
    if wait {
        eprintln!("Waiting for {name} to be Ready...");
        wait::until(api, name, timeout, progress, is_ready).await?;
        println!("databasecluster {name} is Ready");
    }
    Ok(())
}

fn progress(db: Option<&DatabaseCluster>) -> String {
    let Some(db) = db else {
        return "not found".into();
    };
    let status = db.status.clone().unwrap_or_default();
    let ready = conditions::find(&status.conditions, conditions::READY);
    format!(
        "phase {}, {}/{} ready{}",
        status.phase.map(|p| p.as_str()).unwrap_or("Pending"),
        status.ready_replicas,
        db.spec.replicas,
        ready
            .map(|c| format!(" — {}: {}", c.reason, c.message))
            .unwrap_or_default()
    )
}

fn is_ready(db: Option<&DatabaseCluster>) -> bool {
    db.and_then(|d| d.status.as_ref()).is_some_and(|s| {
        conditions::find(&s.conditions, conditions::READY)
            .is_some_and(|c| c.status == conditions::TRUE)
    }) && db.is_some_and(|d| {
        d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
    })
}

async fn get(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
) -> anyhow::Result<DatabaseCluster> {
    match api.get_opt(name).await {
        Ok(Some(db)) => Ok(db),
        Ok(None) => anyhow::bail!(
            "databasecluster {name} not found in namespace {}",
            connection.namespace
        ),
        Err(e) => Err(cluster::explain(
            e,
            &format!("reading databasecluster {name}"),
            &connection.server,
        )),
    }
}

/// Pods and events of an owner, for `status` commands. A list that failed is kept as its
/// error, so the output says so instead of "(none)".
pub struct Related {
    pub pods: Result<Vec<Pod>, String>,
    pub events: Result<Vec<Event>, String>,
}

impl Related {
    /// The errors of the lists that failed, as one error for the exit code.
    pub fn check(&self) -> anyhow::Result<()> {
        let errors: Vec<&str> = [self.pods.as_ref().err(), self.events.as_ref().err()]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", errors.join("; "))
        }
    }

    /// The lists for JSON/YAML output (a failed list is left out; the error follows).
    pub fn lists(&self) -> (Vec<Pod>, Vec<Event>) {
        (
            self.pods.clone().unwrap_or_default(),
            self.events.clone().unwrap_or_default(),
        )
    }
}

/// When an event was last seen: its series' latest occurrence, else its own time.
fn last_seen(e: &Event) -> Option<k8s_openapi::jiff::Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or(e.event_time.as_ref().map(|t| t.0))
}

pub async fn pods_and_events(
    connection: &Connection,
    selector: Option<&str>,
    name: &str,
) -> Related {
    let describe = |what: &str, e: kube::Error| {
        format!(
            "{:#}",
            cluster::explain(
                e,
                &format!("listing the {what} of {name}"),
                &connection.server
            )
        )
    };
    let pods: Api<Pod> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let pods = match selector {
        Some(selector) => pods
            .list(&ListParams::default().labels(selector))
            .await
            .map(|l| l.items)
            .map_err(|e| describe("pods", e)),
        None => Ok(Vec::new()),
    };
    let events: Api<Event> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let events = events
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .map(|l| {
            let mut events = l.items;
            events.sort_by_key(last_seen);
            let skip = events.len().saturating_sub(10);
            events.into_iter().skip(skip).collect()
        })
        .map_err(|e| describe("events", e));
    Related { pods, events }
}

pub fn print_pods_and_events(related: &Related) {
    println!("\nPods:");
    match &related.pods {
        Err(error) => println!("  (could not list: {error})"),
        Ok(pods) if pods.is_empty() => println!("  (none)"),
        Ok(pods) => {
            let rows: Vec<Vec<String>> = pods
                .iter()
                .map(|p| {
                    let status = p.status.as_ref();
                    let ready = status
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| c.status.clone())
                        .unwrap_or_else(|| "Unknown".into());
                    vec![
                        format!("  {}", p.name_any()),
                        status.and_then(|s| s.phase.clone()).unwrap_or_default(),
                        ready,
                        p.spec
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default(),
                    ]
                })
                .collect();
            table(&["  NAME", "PHASE", "READY", "NODE"], &rows);
        }
    }
    println!("\nRecent events:");
    match &related.events {
        Err(error) => println!("  (could not list: {error})"),
        Ok(events) if events.is_empty() => println!("  (none)"),
        Ok(events) => {
            for e in events {
                println!(
                    "  {:<8} {:<22} {}",
                    e.type_.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.note.clone().unwrap_or_default()
                );
            }
        }
    }
}

async fn status(
    global: &GlobalArgs,
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let status = db.status.clone().unwrap_or_default();
    let related = pods_and_events(connection, status.selector.as_deref(), name).await;
    let (pods, events) = related.lists();
    if output::structured(
        global.output,
        &json!({ "databaseCluster": db, "pods": pods, "events": events }),
    )? {
        return related.check();
    }
    println!("Name:        {}/{}", connection.namespace, name);
    println!("Engine:      {} {}", db.spec.engine, db.spec.version);
    println!(
        "Phase:       {}",
        status.phase.map(|p| p.as_str()).unwrap_or("Pending")
    );
    println!(
        "Instances:   {}/{} ready",
        status.ready_replicas, db.spec.replicas
    );
    println!(
        "Storage:     {} per instance",
        status
            .storage_size
            .as_deref()
            .unwrap_or(&db.spec.storage.size)
    );
    println!(
        "Primary:     {}",
        status.primary_endpoint.as_deref().unwrap_or("-")
    );
    println!(
        "Replicas:    {}",
        status.replica_endpoint.as_deref().unwrap_or("-")
    );
    println!(
        "Credentials: secret/{}",
        status.connection_secret_name.as_deref().unwrap_or("-")
    );
    if let Some(epoch) = status.failover_epoch {
        println!(
            "Failovers:   {epoch} (last at {})",
            status.last_failover_time.as_deref().unwrap_or("-")
        );
    }
    println!(
        "Last backup: {}",
        match (&status.last_backup, &status.last_backup_name) {
            (Some(at), Some(name)) => format!("{at} ({name})"),
            (Some(at), None) => at.clone(),
            _ => "-".into(),
        }
    );
    println!(
        "Next backup: {}",
        status
            .next_scheduled_backup
            .as_deref()
            .map(|t| format!(
                "{t} (schedule {})",
                db.spec
                    .backup
                    .as_ref()
                    .map(|b| b.schedule.as_str())
                    .unwrap_or("-")
            ))
            .unwrap_or_else(|| "- (no schedule running)".into())
    );
    output::conditions(&status.conditions);
    if !status.instances.is_empty() {
        println!();
        table(
            &[
                "INSTANCE", "ROLE", "READY", "TIMELINE", "LAG", "RESTARTS", "MESSAGE",
            ],
            &status
                .instances
                .iter()
                .map(|i| {
                    vec![
                        i.name.clone(),
                        i.role.clone().unwrap_or_else(|| "-".into()),
                        i.ready.to_string(),
                        i.timeline.map_or("-".into(), |t| t.to_string()),
                        i.lag_bytes.map_or("-".into(), |l| format!("{l} B")),
                        restarts(i.restarts, i.last_restart_time.as_deref()),
                        i.message.clone().unwrap_or_default(),
                    ]
                })
                .collect::<Vec<_>>(),
        );
    }
    print_pods_and_events(&related);
    related.check()
}

/// `kubectl get pods`' form: `0`, or `2 (5m ago)`.
fn restarts(count: Option<i32>, last: Option<&str>) -> String {
    let count = count.unwrap_or(0);
    let ago = last
        .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map(|t| {
            let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t);
            format!(" ({} ago)", output::age(Some(&at)))
        });
    match ago {
        Some(ago) if count > 0 => format!("{count}{ago}"),
        _ => count.to_string(),
    }
}

async fn promote(
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    pod: &str,
    force: bool,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let status = db.status.clone().unwrap_or_default();
    if !status.instances.iter().any(|i| i.name == pod) {
        let names: Vec<&str> = status.instances.iter().map(|i| i.name.as_str()).collect();
        anyhow::bail!(
            "{pod} is not an instance of databasecluster {name} (instances: {})",
            names.join(", ")
        );
    }
    let asked_at = k8s_openapi::jiff::Timestamp::now();
    // Without --force an earlier forced request's permission is taken back.
    let patch = json!({ "metadata": { "annotations": {
        SWITCHOVER_ANNOTATION: pod,
        FORCE_FAILOVER_ANNOTATION: force.then_some("true"),
    } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| {
            cluster::explain(
                e,
                &format!("requesting a switchover of databasecluster {name}"),
                &connection.server,
            )
        })?;
    let what = if force {
        "switchover (or, if the primary does not serve, failover) to"
    } else {
        "switchover to"
    };
    println!(
        "databasecluster {}/{name}: {what} {pod} requested",
        connection.namespace
    );
    if !wait {
        return Ok(());
    }
    let target = pod.to_string();
    wait::until(api, name, timeout, progress, move |db| {
        promoted(db, &target) || switchover_refused(db, &target)
    })
    .await?;
    // Done is final once seen (a later readiness blip is not a refusal); a refusal too.
    if !switchover_refused(Some(&get(connection, api, name).await?), pod) {
        println!("{pod} is the primary");
        return Ok(());
    }
    // The operator answered the request without taking it up; its event, published just
    // before, says why (an older one is about an earlier request).
    let recent = |e: &Event| last_seen(e).is_some_and(|at| at >= asked_at - EVENT_CLOCK_SKEW);
    let why = pods_and_events(connection, None, name)
        .await
        .events
        .ok()
        .and_then(|events| {
            events
                .into_iter()
                .rev()
                .find(|e| e.reason.as_deref() == Some(SWITCHOVER_REFUSED) && recent(e))
                .and_then(|e| e.note)
        })
        .unwrap_or_else(|| format!("no reason recorded, see `devctl db status {name}`"));
    anyhow::bail!("the operator refused the switchover of databasecluster {name} to {pod}: {why}")
}

/// How far the operator's clock (event times) may be behind this machine's.
const EVENT_CLOCK_SKEW: k8s_openapi::jiff::SignedDuration =
    k8s_openapi::jiff::SignedDuration::from_secs(30);

/// The event reason of a switchover request the operator did not take up.
const SWITCHOVER_REFUSED: &str = "SwitchoverRefused";

/// `pod` is the ready primary and no switchover is under way.
fn promoted(db: Option<&DatabaseCluster>, pod: &str) -> bool {
    db.and_then(|d| d.status.as_ref())
        .is_some_and(|s| s.current_primary.as_deref() == Some(pod) && s.target_primary.is_none())
        && is_ready(db)
}

/// The request is gone (the operator answers every request by removing it), yet no switchover
/// to `pod` is under way or done: refused.
fn switchover_refused(db: Option<&DatabaseCluster>, pod: &str) -> bool {
    db.is_some_and(|d| {
        !d.annotations().contains_key(SWITCHOVER_ANNOTATION)
            && d.status.as_ref().is_none_or(|s| {
                s.target_primary.is_none() && s.current_primary.as_deref() != Some(pod)
            })
    })
}

async fn credentials(
    global: &GlobalArgs,
    connection: &Connection,
    api: &Api<DatabaseCluster>,
    name: &str,
    show_password: bool,
) -> anyhow::Result<()> {
    let db = get(connection, api, name).await?;
    let secret_name = db
        .status
        .as_ref()
        .and_then(|s| s.connection_secret_name.clone())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "databasecluster {name} has no credentials yet (is the operator running?)"
            )
        })?;
    let secrets: Api<Secret> = Api::namespaced(connection.client.clone(), &connection.namespace);
    let secret = secrets.get(&secret_name).await.map_err(|e| {
        cluster::explain(
            e,
            &format!("reading secret {secret_name}"),
            &connection.server,
        )
    })?;
    let data = secret.data.unwrap_or_default();
    let field = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).to_string())
            .unwrap_or_default()
    };
    let password = field("password");
    let mask = |text: String| {
        if show_password {
            text
        } else {
            text.replace(&password, "********")
        }
    };
    let values = json!({
        "username": field("username"),
        "password": mask(password.clone()),
        "host": field("host"),
        "port": field("port"),
        "dbname": field("dbname"),
        "uri": mask(field("uri")),
        "secret": secret_name,
    });
    if output::structured(global.output, &values)? {
        return Ok(());
    }
    for key in [
        "uri", "host", "port", "dbname", "username", "password", "secret",
    ] {
        println!("{key:<9} {}", values[key].as_str().unwrap_or_default());
    }
    if !show_password {
        eprintln!("(password masked; pass --show-password to print it)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_read_like_kubectls() {
        assert_eq!(restarts(None, None), "0");
        let five_minutes_ago = (k8s_openapi::jiff::Timestamp::now()
            - k8s_openapi::jiff::SignedDuration::from_secs(300))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
        assert_eq!(restarts(Some(2), Some(&five_minutes_ago)), "2 (5m ago)");
        assert_eq!(restarts(Some(1), Some("not a time")), "1");
    }

    fn cluster(annotation: Option<&str>, current: &str, target: Option<&str>) -> DatabaseCluster {
        serde_json::from_value(json!({
            "apiVersion": "db.devctl.io/v1beta1",
            "kind": "DatabaseCluster",
            "metadata": {
                "name": "db",
                "generation": 1,
                "annotations": annotation.map(|pod| json!({ SWITCHOVER_ANNOTATION: pod })),
            },
            "spec": { "engine": "postgres", "version": "16.4", "storage": { "size": "1Gi" } },
            "status": {
                "observedGeneration": 1,
                "currentPrimary": current,
                "targetPrimary": target,
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Ready", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_promote_wait_ends_when_the_request_is_refused_not_at_its_timeout() {
        // Asked, not yet answered.
        let asked = cluster(Some("db-1"), "db-0", None);
        assert!(!promoted(Some(&asked), "db-1") && !switchover_refused(Some(&asked), "db-1"));
        // Taken up: the status names the target, then the request goes.
        let under_way = cluster(None, "db-0", Some("db-1"));
        assert!(!switchover_refused(Some(&under_way), "db-1"));
        // Done.
        let done = cluster(None, "db-1", None);
        assert!(promoted(Some(&done), "db-1") && !switchover_refused(Some(&done), "db-1"));
        // Answered without a switchover: refused.
        let refused = cluster(None, "db-0", None);
        assert!(switchover_refused(Some(&refused), "db-1"));
        assert!(!promoted(Some(&refused), "db-1"));
    }
}
