//! After a major upgrade, on the primary that was upgraded: `vacuumdb --all
//! --analyze-in-stages` in the background (pg_upgrade carries no planner statistics over),
//! and the old data directory kept beside the new one (`<data>.pre-upgrade-<old>`, the way
//! back in copy mode) removed once the cluster records the new version as running — the
//! upgrade is confirmed then (docs/major-upgrade.md).

use std::time::Duration;

use super::*;
use crate::major_upgrade::{confirm, kept_dir};

/// ANALYZE of a large database takes long; it runs beside the workload.
const ANALYZE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

impl Agent {
    /// One look, on every tick of a running primary.
    pub(super) fn tend_upgrade_followup(&mut self, probe: &Probe) {
        if probe.role != devctl_api::instance::ROLE_PRIMARY {
            return;
        }
        let Some(binaries) = self.binaries_major else {
            return;
        };
        let data = self.engine.data_dir().to_path_buf();
        let kept: Vec<u32> = (1..binaries)
            .filter(|m| kept_dir(&data, *m).is_dir())
            .collect();
        if kept.is_empty() {
            return;
        }
        match &self.upgrade_followup {
            None => {
                let Some(bin) = self.engine.postgres_bin_dir() else {
                    return;
                };
                let program = bin.join("vacuumdb");
                let args = vec![
                    "--all".to_string(),
                    "--analyze-in-stages".into(),
                    "-h".into(),
                    self.config.run_dir.display().to_string(),
                    "-p".into(),
                    self.config.port.to_string(),
                    "-U".into(),
                    crate::engine::PG_SUPERUSER.into(),
                ];
                let cwd = self.config.run_dir.clone();
                tracing::info!("after the major upgrade: vacuumdb --all --analyze-in-stages");
                self.upgrade_followup = Some(tokio::spawn(async move {
                    match crate::process::run(&program, &args, &[], &cwd, b"", ANALYZE_TIMEOUT)
                        .await
                    {
                        Ok(_) => tracing::info!("after the major upgrade: statistics rebuilt"),
                        Err(e) => tracing::warn!(
                            "after the major upgrade: vacuumdb --analyze-in-stages: {}",
                            one_line(&e)
                        ),
                    }
                }));
            }
            Some(task) if task.is_finished() => {
                let confirmed = self
                    .cluster
                    .as_ref()
                    .is_some_and(|c| c.borrow().current_major == Some(binaries));
                if confirmed {
                    for old in kept {
                        tracing::info!(
                            "the major upgrade completed: removing the old data directory {}",
                            kept_dir(&data, old).display()
                        );
                        confirm(&data, old);
                    }
                    self.upgrade_followup = None;
                }
            }
            Some(_) => {}
        }
    }
}
