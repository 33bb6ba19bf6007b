//! `devctl-agent major-upgrade`: the init container of every PostgreSQL pod, which runs the
//! upgrade step of a major version upgrade (docs/major-upgrade.md) before the agent starts.
//!
//! It does something only on the instance `status.majorUpgrade.primary` names, while the
//! step is `Upgrading`: `pg_upgrade` of its stopped data directory from the old major's
//! binaries to this image's ([`crate::major_upgrade`]), and the result written on its own
//! pod ([`MAJOR_UPGRADE_RESULT_ANNOTATION`]) for the operator. After a failed upgrade
//! (`Failed`, the pod back on the old major's image) it puts the kept old data directory back
//! if the upgraded one had taken its place. Everywhere else it exits at once: replicas are
//! cloned again by their agents, which see data of an older major.
//!
//! Exit 0 whenever the pod may go on (nothing to do, or the result recorded); 1 when the
//! result could not be recorded, so that the kubelet runs it again (every step of an upgrade
//! is resumable).

use std::path::{Path, PathBuf};

use devctl_api::instance::{MAJOR_UPGRADE_RESULT_ANNOTATION, UpgradeResult, env};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::cluster::database_cluster_resource;
use crate::config::{Config, EngineKind};
use crate::engine::find_postgres_bin_dir;
use crate::error::one_line;
use crate::major_upgrade::{
    Method, Outcome, Upgrade, UpgradeError, binaries_major, data_major, roll_back,
};

/// Where the old major's binaries are looked for without [`env::POSTGRES_BIN_ROOTS`]:
/// Debian's layout, which the official images share. The test environment names its own.
const DEFAULT_BIN_ROOT: &str = "/usr/lib/postgresql";

/// `status.majorUpgrade` as the step reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub step: String,
    pub primary: Option<String>,
    pub from: String,
    pub to: String,
    pub method: Method,
}

/// Pure: `status.majorUpgrade` of a DatabaseCluster object.
pub fn pending(object: &serde_json::Value) -> Option<Pending> {
    let upgrade = object.get("status")?.get("majorUpgrade")?;
    let text = |field: &str| upgrade.get(field)?.as_str().map(str::to_string);
    Some(Pending {
        step: text("step")?,
        primary: text("primary"),
        from: text("from")?,
        to: text("to")?,
        method: match text("method").as_deref() {
            Some("link") => Method::Link,
            _ => Method::Copy,
        },
    })
}

/// What this instance's step does (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Nothing(String),
    /// Upgrade from the old major `from` to the binaries' `to`.
    Upgrade {
        from: u32,
    },
    /// Put the old data directory (major `old`) back over the upgraded one (major `new`).
    RollBack {
        old: u32,
        new: u32,
    },
}

/// Pure: the action for pod `me` whose data holds `data` and whose binaries run `binaries`.
pub fn decide(me: &str, pending: Option<&Pending>, data: Option<u32>, binaries: u32) -> Action {
    let Some(pending) = pending.filter(|p| p.primary.as_deref() == Some(me)) else {
        return Action::Nothing("no major upgrade of this instance".into());
    };
    let from = pending.from.split('.').next().and_then(|m| m.parse().ok());
    match (pending.step.as_str(), from, data) {
        ("Upgrading", Some(from), Some(data)) if data == from && binaries > from => {
            Action::Upgrade { from }
        }
        // Resumed after a crash mid-swap: `run` finds where it stands.
        ("Upgrading", Some(from), None) if binaries > from => Action::Upgrade { from },
        ("Upgrading", Some(from), Some(data)) if data == binaries && binaries > from => {
            Action::Upgrade { from }
        }
        ("Failed" | "Refused", Some(from), Some(data)) if data > binaries && binaries == from => {
            Action::RollBack {
                old: from,
                new: data,
            }
        }
        (step, _, _) => Action::Nothing(format!(
            "major upgrade step {step}: data {}, binaries {binaries}: nothing to do",
            data.map_or("none".to_string(), |d| d.to_string())
        )),
    }
}

/// Why the step has nothing to do whatever the cluster says, without asking it (every start of
/// every PostgreSQL pod runs the step): the data is the binaries' major, or there is none and
/// no upgrade was interrupted mid-swap.
fn nothing_to_do(data: &Path, binaries: u32) -> Option<String> {
    match data_major(data) {
        // Until the upgrade is confirmed the kept old directory stays: a step run again after
        // it could not record its result asks the cluster and records it.
        Some(major)
            if major == binaries && !crate::major_upgrade::upgrade_started(data, binaries) =>
        {
            Some(format!(
                "the data directory is PostgreSQL {major}'s, as the binaries: nothing to upgrade"
            ))
        }
        None if !crate::major_upgrade::upgrade_started(data, binaries) => {
            Some("no data directory yet: nothing to upgrade".into())
        }
        _ => None,
    }
}

/// The old major's `bin` directory under `roots` (pure over the file system).
pub fn old_bin_dir(roots: &str, major: u32) -> Option<PathBuf> {
    roots
        .split(':')
        .filter(|r| !r.is_empty())
        .map(|root| Path::new(root).join(major.to_string()).join("bin"))
        .find(|bin| bin.join("postgres").is_file() && bin.join("pg_upgrade").is_file())
}

/// `devctl-agent major-upgrade`: the exit code.
pub async fn run_from_env() -> i32 {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("devctl-agent major-upgrade: {}", e.one_line());
            return e.exit_code();
        }
    };
    if config.engine != EngineKind::Postgres {
        return 0;
    }
    let new_bin = match find_postgres_bin_dir(config.engine_bin_dir.as_deref()) {
        Ok(bin) => bin,
        Err(e) => {
            eprintln!("devctl-agent major-upgrade: {}", e.one_line());
            return 1;
        }
    };
    let binaries = match binaries_major(&new_bin).await {
        Ok(major) => major,
        Err(e) => {
            eprintln!("devctl-agent major-upgrade: {e}");
            return 1;
        }
    };
    let data = config.data_dir.clone();
    if let Some(why) = nothing_to_do(&data, binaries) {
        println!("{why}");
        return 0;
    }
    let client = match crate::agent::kube_client().await {
        Ok(client) => client,
        Err(e) => {
            eprintln!("devctl-agent major-upgrade: {}", e.one_line());
            return 1;
        }
    };
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &config.pod_namespace,
        &database_cluster_resource(),
    );
    let pending = match clusters.get(&config.cluster).await {
        Ok(object) => pending(&object.data),
        Err(e) => {
            eprintln!(
                "devctl-agent major-upgrade: reading DatabaseCluster {}: {}",
                config.cluster,
                one_line(&e.to_string())
            );
            return 1;
        }
    };
    let action = decide(
        &config.pod_name,
        pending.as_ref(),
        data_major(&data),
        binaries,
    );
    let Some(pending) = pending else {
        println!("no major upgrade");
        return 0;
    };
    let result = match action {
        Action::Nothing(why) => {
            println!("{why}");
            return 0;
        }
        Action::RollBack { old, new } => match roll_back(&data, old, new) {
            Ok(()) => outcome(
                &pending,
                "RolledBack",
                "the old data directory is back",
                true,
            ),
            Err(e) => outcome(&pending, "Failed", &e, false),
        },
        Action::Upgrade { from } => {
            let roots = std::env::var(env::POSTGRES_BIN_ROOTS)
                .ok()
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| DEFAULT_BIN_ROOT.to_string());
            match old_bin_dir(&roots, from) {
                None => outcome(
                    &pending,
                    "Refused",
                    &format!(
                        "this image has no PostgreSQL {from} binaries (pg_upgrade needs both majors: looked for {from}/bin/postgres under {roots}); set spec.upgrade.image to an image that carries both"
                    ),
                    true,
                ),
                Some(old_bin) => {
                    let upgrade = Upgrade {
                        old_bin,
                        new_bin,
                        data: data.clone(),
                        method: pending.method,
                        new_major: binaries,
                        server_settings: Vec::new(),
                        socket_dir: config.run_dir.clone(),
                        port: 50432,
                        fail_after_pg_upgrade: crate::test_hooks::TestHooks::from_env()
                            .major_upgrade_fails(),
                    };
                    match upgrade.run(false).await {
                        Ok(Outcome::Upgraded { .. } | Outcome::Checked) => {
                            outcome(&pending, "Upgraded", "", true)
                        }
                        Ok(Outcome::AlreadyDone) => outcome(&pending, "AlreadyDone", "", true),
                        Err(UpgradeError::Refused(message)) => {
                            outcome(&pending, "Refused", &message, true)
                        }
                        Err(UpgradeError::Failed {
                            message,
                            old_intact,
                        }) => outcome(&pending, "Failed", &message, old_intact),
                    }
                }
            }
        }
    };
    println!(
        "{}",
        serde_json::to_string(&result).unwrap_or_else(|_| result.result.clone())
    );
    let pods: Api<Pod> = Api::namespaced(client, &config.pod_namespace);
    let value = serde_json::to_string(&result).unwrap_or_default();
    let patch =
        json!({ "metadata": { "annotations": { MAJOR_UPGRADE_RESULT_ANNOTATION: value } } });
    match pods
        .patch(
            &config.pod_name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => 0,
        Err(e) => {
            eprintln!(
                "devctl-agent major-upgrade: recording the result on pod {}: {}",
                config.pod_name,
                one_line(&e.to_string())
            );
            1
        }
    }
}

fn outcome(pending: &Pending, result: &str, message: &str, old_intact: bool) -> UpgradeResult {
    UpgradeResult {
        to: pending.to.clone(),
        result: result.to_string(),
        message: message.to_string(),
        old_intact,
        at: Some(k8s_openapi::jiff::Timestamp::now().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upgrade(step: &str, primary: &str) -> Pending {
        Pending {
            step: step.into(),
            primary: Some(primary.into()),
            from: "15.4".into(),
            to: "17.2".into(),
            method: Method::Copy,
        }
    }

    #[test]
    fn only_the_named_instance_upgrades_and_only_while_upgrading() {
        let p = upgrade("Upgrading", "db-1");
        assert_eq!(
            decide("db-1", Some(&p), Some(15), 17),
            Action::Upgrade { from: 15 }
        );
        // Replicas are cloned again by their agents.
        assert!(matches!(
            decide("db-0", Some(&p), Some(15), 17),
            Action::Nothing(_)
        ));
        assert!(matches!(
            decide("db-1", None, Some(15), 17),
            Action::Nothing(_)
        ));
        assert!(matches!(
            decide("db-1", Some(&upgrade("BackingUp", "db-1")), Some(15), 17),
            Action::Nothing(_)
        ));
        // Done already (a restart after it): `run` says AlreadyDone.
        assert_eq!(
            decide("db-1", Some(&p), Some(17), 17),
            Action::Upgrade { from: 15 }
        );
        // Moved aside mid-swap: `run` finishes it.
        assert_eq!(
            decide("db-1", Some(&p), None, 17),
            Action::Upgrade { from: 15 }
        );
        // The old image's binaries on the old data: nothing.
        assert!(matches!(
            decide("db-1", Some(&p), Some(15), 15),
            Action::Nothing(_)
        ));
    }

    #[test]
    fn a_failed_upgrade_back_on_the_old_image_puts_the_old_data_back() {
        let p = upgrade("Failed", "db-1");
        assert_eq!(
            decide("db-1", Some(&p), Some(17), 15),
            Action::RollBack { old: 15, new: 17 }
        );
        // The old data is in place already (the failure came before the swap).
        assert!(matches!(
            decide("db-1", Some(&p), Some(15), 15),
            Action::Nothing(_)
        ));
    }

    #[test]
    fn reads_the_status() {
        let object = json!({"status": {"majorUpgrade": {
            "from": "15.4", "to": "17.2", "step": "Upgrading", "method": "link", "primary": "db-0"
        }}});
        assert_eq!(
            pending(&object),
            Some(Pending {
                method: Method::Link,
                ..upgrade("Upgrading", "db-0")
            })
        );
        assert_eq!(pending(&json!({"status": {}})), None);
    }

    #[test]
    fn the_old_binaries_are_found_under_the_first_root_that_has_them() {
        let dir = std::env::temp_dir().join(format!("devctl-roots-{}", std::process::id()));
        let bin = dir.join("b/15/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("postgres"), b"").unwrap();
        std::fs::write(bin.join("pg_upgrade"), b"").unwrap();
        let roots = format!("{}:{}", dir.join("a").display(), dir.join("b").display());
        assert_eq!(old_bin_dir(&roots, 15), Some(bin));
        assert_eq!(old_bin_dir(&roots, 14), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
