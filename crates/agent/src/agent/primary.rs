//! A primary's upkeep: the replication role, synchronous standbys, and the replicas' slots.

use super::*;

/// `synchronous_standby_names` for the primary `me` from the cluster's spec: every other
/// instance by name (never `*`, which would count a running `pg_basebackup` as a standby).
pub fn synchronous_standby_names(view: &ClusterView, me: &str) -> String {
    let Some((method, number)) = &view.synchronous else {
        return String::new();
    };
    let others: Vec<String> = other_instances(view, me)
        .map(|name| format!("\"{name}\""))
        .collect();
    if others.is_empty() {
        return String::new();
    }
    format!("{method} {number} ({})", others.join(", "))
}

/// The slots the primary `me` keeps: one per other instance of `spec.replicas`.
pub(super) fn desired_slots(view: &ClusterView, me: &str) -> Vec<String> {
    other_instances(view, me)
        .map(|name| slot_name(&name))
        .collect()
}

/// The pod names of the cluster's other instances (`spec.replicas`, named like `me`:
/// `<statefulset>-<ordinal>`); none when `me` is not so named.
fn other_instances<'a>(view: &ClusterView, me: &'a str) -> impl Iterator<Item = String> + 'a {
    let prefix = me.rsplit_once('-').map(|(prefix, _)| prefix);
    let count = if prefix.is_some() {
        view.replicas.max(1)
    } else {
        0
    };
    (0..count)
        .filter_map(move |ordinal| Some(format!("{}-{ordinal}", prefix?)))
        .filter(move |name| name != me)
}

/// One step bringing the agent's slots in line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SlotChange {
    Create(String),
    Drop(String),
    /// Lost (invalidated) and unused: dropped and created anew, reserving WAL from now.
    Renew(String),
}

/// What turns `existing` into `desired`. An active slot is never dropped (PostgreSQL
/// refuses; its walsender ends when the removed pod goes away, and the next probe retries).
pub(super) fn slot_changes(
    desired: &[String],
    existing: &[crate::engine::Slot],
) -> Vec<SlotChange> {
    let mut changes = Vec::new();
    for name in desired {
        match existing.iter().find(|s| &s.name == name) {
            None => changes.push(SlotChange::Create(name.clone())),
            Some(slot) if slot.lost && !slot.active => {
                changes.push(SlotChange::Renew(name.clone()))
            }
            Some(_) => {}
        }
    }
    for slot in existing {
        if !desired.contains(&slot.name) && !slot.active {
            changes.push(SlotChange::Drop(slot.name.clone()));
        }
    }
    changes
}

impl Agent {
    /// Primary: `synchronous_standby_names` in line with `spec.replication.synchronous`.
    pub(super) async fn apply_synchronous_standbys(&mut self) {
        if self.cluster.is_none() {
            return; // PostgreSQL only
        }
        let desired = synchronous_standby_names(&self.view(), &self.config.pod_name);
        if self.sync_applied.as_deref() == Some(desired.as_str()) {
            return;
        }
        match self.engine.set_synchronous_standby_names(&desired).await {
            Ok(()) => {
                tracing::info!(synchronous_standby_names = %desired, "synchronous replication set");
                self.sync_applied = Some(desired);
            }
            Err(e) => {
                let message = format!("setting synchronous_standby_names: {e}");
                tracing::error!("{message}");
                self.replication_apply_error = Some(message);
            }
        }
    }

    /// The agent's replication slots in line with the cluster: on the primary one per other
    /// instance (`spec.replicas`), a lost one (past `max_slot_wal_keep_size`) made anew
    /// once unused; slots of removed instances and any on a replica dropped. Slots the
    /// agent did not name are never touched.
    pub(super) async fn apply_slots(&mut self, probe: &Probe, primary: bool) {
        let desired = if primary {
            desired_slots(&self.view(), &self.config.pod_name)
        } else {
            Vec::new()
        };
        let mut problems = Vec::new();
        for change in slot_changes(&desired, &probe.slots) {
            let result = match &change {
                SlotChange::Create(name) => self.engine.create_slot(name).await,
                SlotChange::Drop(name) => self.engine.drop_slot(name).await,
                SlotChange::Renew(name) => match self.engine.drop_slot(name).await {
                    Ok(()) => self.engine.create_slot(name).await,
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(()) => tracing::info!(?change, "replication slot"),
                Err(e) => problems.push(format!("replication slot {change:?}: {e}")),
            }
        }
        let problem = (!problems.is_empty()).then(|| problems.join("; "));
        if problem.is_some() && problem != self.slot_problem {
            tracing::warn!("{}", problem.as_deref().unwrap_or_default());
        }
        self.slot_problem = problem;
    }

    /// Primary: the replication role in line with the replication Secret, once the app
    /// role and database exist (the role may connect to no database).
    pub(super) async fn apply_replication_role(&mut self) {
        let (Some(replication), Some(app)) =
            (self.replication_desired.clone(), self.desired.clone())
        else {
            return;
        };
        let key = format!("{}/{}", replication.version, app.version);
        if self.replication_applied.as_deref() == Some(key.as_str()) {
            return;
        }
        match self.engine.apply_replication_role(&replication, &app).await {
            Ok(()) => {
                tracing::info!(
                    version = %replication.version,
                    user = %replication.username,
                    "applied the replication Secret"
                );
                self.replication_applied = Some(key);
                self.replication_apply_error = None;
            }
            Err(e) => {
                let message = format!("applying the replication role: {e}");
                tracing::error!("{message}");
                self.replication_apply_error = Some(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synchronous_standbys_are_the_other_instances_by_name() {
        let mut view = ClusterView {
            replicas: 3,
            synchronous: Some(("ANY".into(), 1)),
            ..Default::default()
        };
        assert_eq!(
            synchronous_standby_names(&view, "db-1"),
            r#"ANY 1 ("db-0", "db-2")"#
        );
        view.replicas = 1;
        assert_eq!(synchronous_standby_names(&view, "db-0"), "");
        view.synchronous = None;
        view.replicas = 3;
        assert_eq!(synchronous_standby_names(&view, "db-0"), "");
    }

    #[test]
    fn the_primary_keeps_one_slot_per_other_instance_and_drops_the_rest() {
        use crate::engine::Slot;
        let view = ClusterView {
            replicas: 3,
            ..Default::default()
        };
        let desired = desired_slots(&view, "db-1");
        assert_eq!(desired, ["devctl_db_0", "devctl_db_2"]);
        let slot = |name: &str, active, lost| Slot {
            name: name.into(),
            active,
            lost,
        };
        // Missing: created. Present and healthy: kept.
        assert_eq!(
            slot_changes(&desired, &[slot("devctl_db_0", true, false)]),
            [SlotChange::Create("devctl_db_2".into())]
        );
        // Lost: renewed once unused; an active one is left to its walsender.
        assert_eq!(
            slot_changes(
                &desired,
                &[
                    slot("devctl_db_0", false, true),
                    slot("devctl_db_2", true, true)
                ]
            ),
            [SlotChange::Renew("devctl_db_0".into())]
        );
        // A removed instance's slot (scaled down to 2) and the primary's own: dropped, but
        // not while a walsender still streams through it.
        let two = desired_slots(
            &ClusterView {
                replicas: 2,
                ..view.clone()
            },
            "db-0",
        );
        assert_eq!(
            slot_changes(
                &two,
                &[
                    slot("devctl_db_1", true, false),
                    slot("devctl_db_2", false, false),
                    slot("devctl_db_0", false, false),
                ]
            ),
            [
                SlotChange::Drop("devctl_db_2".into()),
                SlotChange::Drop("devctl_db_0".into())
            ]
        );
        assert_eq!(slot_changes(&[], &[slot("devctl_db_2", true, false)]), []);
        // A single instance keeps none.
        assert!(
            desired_slots(
                &ClusterView {
                    replicas: 1,
                    ..view
                },
                "db-0"
            )
            .is_empty()
        );
    }
}
