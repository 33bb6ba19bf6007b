//! Act: carries out a [`Plan`] in order — the only code of the DatabaseCluster reconcile
//! that writes (docs/database-cluster.md, *How a reconcile works*).
//!
//! Order and preconditions: the children first ([`converge`]); the volumes and the pods only
//! once the children applied (no pod is replaced in a reconcile that changed the
//! StatefulSet: its revisions then still describe the template before); the news; the answer to a request and a failover epoch's baseline; the
//! backups due and expired; then the status — decided last, from the observation and what
//! the writes left, with the step's events once it is recorded; the request dropped only
//! once the status recorded its answer.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{FORCE_FAILOVER_ANNOTATION, ROLE_LABEL, SWITCHOVER_ANNOTATION};
use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;

use super::backup;
use super::backup_lifecycle;
use super::converge::converge;
use super::events;
use super::instances;
use super::observe::Observation;
use super::plan::Plan;
use super::pods::{self, PodWrite};
use super::resources::{self, Names};
use super::status::{self, Observed};
use super::timers;
use crate::children::applied;
use crate::children::caches::OwnerKey;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::reconciler::{Announcement, key, now, publish, report_transition};

/// Carries out `plan`, made from `observation`.
pub async fn execute(ctx: &Context, observation: &Observation, mut plan: Plan) -> Result<Action> {
    let db = observation.cluster.as_ref();
    let names = &observation.names;
    let converged = converge(
        db,
        ctx,
        names,
        &plan.target_version,
        observation.stateful_set.as_deref(),
        &observation.store,
    )
    .await;
    let converged = match converged {
        Ok(c) => grow(ctx, db, names, &plan.volumes.expand).await.map(|()| c),
        Err(e) => Err(e),
    };
    let credentials_regenerated = converged.as_ref().is_ok_and(|c| c.credentials_regenerated);
    let volumes_pending = converged.as_ref().ok().and(plan.volumes.pending);
    let regenerated =
        credentials_regenerated.then(|| events::credentials_regenerated(&names.secret()));
    for news in plan.news.iter().chain(regenerated.as_ref()) {
        announce(ctx, db, news).await;
    }
    if let Some(refused) = &plan.primary.answer_now {
        if let Some(why) = refused {
            announce(ctx, db, &events::switchover_refused(why.clone())).await;
        }
        drop_request(ctx, names).await;
    }
    let pods = observation.pods();
    if let Some(epoch) = plan.primary.epoch_started {
        ctx.failover_liveness
            .started(observation.cluster_key(), epoch, &pods);
    }
    // Each step of a failover or switchover waits for a report of a pod or the lock: those
    // may not wait for the rest of a burst.
    if let Some(owner) = OwnerKey::of(db) {
        ctx.caches.hurry(&owner, plan.hurry);
    }
    let converged = match converged {
        Ok(c) => {
            // A template applied just now: the StatefulSet's revisions describe the one
            // before it until its controller catches up, so no pod is replaced on them (a
            // primary could go before the replicas reach the new template).
            let template_changed = applied(Ok(&c.changes), StatefulSet::KIND);
            let written = write_pods(ctx, db, names, &plan.pods, template_changed).await;
            if written.is_ok() {
                // The new primary's role label (what `-rw` selects) is in place now.
                switched(&mut plan);
            }
            written.map(|()| c.changes)
        }
        Err(e) => Err(e),
    };
    if let Some(name) = &plan.upgrade.create_backup
        && let Err(why) = backup_lifecycle::create_pre_upgrade_backup(db, ctx, names, name).await
    {
        tracing::warn!(cluster = %key(db), "major upgrade: {why}");
    }
    let mut scheduled = backup_lifecycle::schedule_step(db, ctx, names, &observation.store).await;
    if let Some(why) = backup_lifecycle::prune(db, ctx, names, &observation.store).await {
        tracing::warn!(cluster = %key(db), "retention: {why}");
        scheduled
            .problem
            .get_or_insert((status::BACKUP_FAILING, format!("retention: {why}")));
    }
    let timer = timers::next_look(
        observation,
        &plan.primary.primary,
        [
            plan.primary.timer,
            scheduled.wait,
            plan.upgrade.look_again(),
        ],
    );
    if let Some(timer) = timer {
        ctx.backoff.retry_within(&key(db), timer);
    }
    let written = Written {
        volumes_pending,
        credentials_regenerated,
        scheduled,
    };
    let (action, recorded) = report_transition(
        ctx,
        db,
        converged,
        |outcome| status_after(ctx, observation, &plan, &written, outcome),
        plan.with_status.clone(),
        // The primary lock's expiry is the one deadline no event announces: nothing happens
        // when nobody renews it, so the reconcile comes back when it would expire.
        timer,
    )
    .await?;
    if recorded && plan.primary.drop_request_when_recorded {
        drop_request(ctx, names).await;
    }
    Ok(action)
}

/// What the writes of this reconcile did, for the status.
struct Written {
    volumes_pending: Option<(usize, usize)>,
    credentials_regenerated: bool,
    scheduled: backup_lifecycle::Scheduled,
}

/// The status ([`status::compute`]) from the observation and what the writes left: the
/// StatefulSet and credentials Secret as applied; `None` when unchanged.
fn status_after(
    ctx: &Context,
    observation: &Observation,
    plan: &Plan,
    written: &Written,
    outcome: std::result::Result<&[crate::children::Change], &Error>,
) -> Option<serde_json::Value> {
    let (db, names) = (observation.cluster.as_ref(), &observation.names);
    let pods = observation.pods();
    let backups = backup::observe(&pods, &observation.store);
    let scheduled = &written.scheduled;
    let (volumes_pending, credentials_regenerated) =
        (written.volumes_pending, written.credentials_regenerated);

    // What the writes left: the StatefulSet and credentials Secret as applied.
    let sts = ctx
        .caches
        .get::<StatefulSet>(&names.namespace, &names.stateful_set());
    let credentials_version = ctx
        .caches
        .kind(Secret::KIND)
        .ok()
        .and_then(|secrets| secrets.meta(&names.namespace, &names.secret()))
        .and_then(|live| live.resource_version)
        .map(|version| version.to_string());
    let target_image = resources::stateful_set::image(db, &plan.target_version);
    let observed = Observed {
        stateful_set: sts.as_deref(),
        target_version: &plan.target_version,
        target_image: &target_image,
        version_refused: plan.version_refused.clone(),
        replication_refused: resources::stateful_set::replication_refused(db),
        scale_down_refused: resources::stateful_set::scale_down_refused(db),
        volumes_pending,
        credentials_regenerated,
        stateful_set_applied: applied(outcome, StatefulSet::KIND),
        updated_pods: pods::at_update_revision(&pods, sts.as_deref()),
        failure: outcome.err().map(Error::failure),
        cluster_domain: &ctx.settings.cluster_domain,
        // The instances the cluster runs (a refused scale-down keeps some past
        // spec.replicas).
        instances: instances::observe(
            &pods,
            resources::stateful_set::instances(db),
            credentials_version.as_deref(),
        ),
        primary: plan.primary.primary.clone(),
        primary_lost: plan.primary.primary_lost.clone(),
        failover_stuck: plan.primary.failover_stuck.clone(),
        backup_problem: backups.0.clone().or(scheduled.problem.clone()),
        // A schedule or retention failure is a backup failure too.
        backup_health: backups.2.clone().map(|mut health| {
            if let Some((reason, why)) = &scheduled.problem
                && *reason == status::BACKUP_FAILING
            {
                health.backup_failing.get_or_insert_with(|| why.clone());
            }
            health
        }),
        last_backup: backups.1.clone(),
        last_scheduled_backup: scheduled.last.clone(),
        major_upgrade: plan.upgrade.record.clone(),
        upgrade_progress: plan
            .upgrade
            .record
            .as_ref()
            .filter(|u| !u.step.is_final())
            .map(|u| format!("{:?}: {}", u.step, u.message.clone().unwrap_or_default())),
        upgrade_problem: plan.upgrade.problem.clone(),
        synchronous_degraded: instances::synchronous_degraded(
            &pods,
            &plan.primary.primary.current,
            db.spec
                .replication
                .as_ref()
                .is_some_and(|r| r.synchronous.is_some()),
        ),
        next_scheduled_backup: scheduled.next.clone(),
    };
    let status = status::compute(db, &observed, &now());
    if let Some(status) = &status {
        // Every reconcile, not only on writes: cheap, and a restarted operator
        // exports unchanged clusters too.
        ctx.settings.metrics.observe_cluster(db, status);
    }
    (status.is_some() && status != db.status).then(|| json!(status))
}

/// The flight record of a promotion notes when the service switched: the first time the
/// pod writes that follow it succeeded.
fn switched(plan: &mut Plan) {
    if let Some(record) = plan.primary.primary.last_failover.as_mut()
        && record.promoted_at.is_some()
        && record.service_switched_at.is_none()
    {
        record.service_switched_at = Some(super::primary_step::stamp_ms(
            k8s_openapi::jiff::Timestamp::now(),
        ));
    }
}

async fn announce(ctx: &Context, db: &DatabaseCluster, news: &Announcement) {
    publish(
        ctx,
        db,
        news.type_,
        news.reason,
        &news.action,
        news.note.clone(),
    )
    .await;
}

/// Removes the switchover request (answered: done, refused or moot).
async fn drop_request(ctx: &Context, names: &Names) {
    let api: Api<DatabaseCluster> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let patch = json!({ "metadata": { "annotations": {
        SWITCHOVER_ANNOTATION: null,
        FORCE_FAILOVER_ANNOTATION: null,
    } } });
    if let Err(error) = api
        .patch(&names.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(%error, "removing the switchover request failed; retried next time");
    }
}

/// Grows each claim in `expand` to `spec.storage.size`.
async fn grow(ctx: &Context, db: &DatabaseCluster, names: &Names, expand: &[String]) -> Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let size = &db.spec.storage.size;
    for claim in expand {
        let patch = json!({ "spec": { "resources": { "requests": { "storage": size } } } });
        api.patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Child {
                action: "expand",
                kind: "PersistentVolumeClaim",
                name: claim.clone(),
                source,
            })?;
        announce(ctx, db, &events::expanding(claim, size)).await;
    }
    Ok(())
}

/// The pod writes in order; a pod gone meanwhile is skipped (its replacement is labelled on
/// the next pass). A role label's echo is no news: the status reads neither the role label
/// nor annotations the operator itself wrote.
async fn write_pods(
    ctx: &Context,
    db: &DatabaseCluster,
    names: &Names,
    writes: &[PodWrite],
    template_changed: bool,
) -> Result<()> {
    for write in writes {
        match write {
            PodWrite::Label {
                pod,
                role,
                annotations,
            } => {
                let mut metadata = json!({ "labels": { ROLE_LABEL: role } });
                if let Some(annotations) = annotations {
                    metadata["annotations"] = annotations.clone();
                }
                patch_pod(ctx, names, "label", pod, metadata).await?;
            }
            PodWrite::Annotate { pod, annotations } => {
                let metadata = json!({ "annotations": annotations });
                patch_pod(ctx, names, "annotate", pod, metadata).await?;
            }
            PodWrite::Replace { .. } if template_changed => {}
            PodWrite::Replace { pod, uid, primary } => {
                replace_pod(ctx, db, names, pod, uid, *primary).await?;
            }
        }
    }
    Ok(())
}

async fn patch_pod(
    ctx: &Context,
    names: &Names,
    action: &'static str,
    pod: &str,
    metadata: serde_json::Value,
) -> Result<()> {
    let patch = json!({ "metadata": metadata });
    match ctx
        .caches
        .applier()
        .patch_quietly::<Pod>(&ctx.client, &ctx.caches, &names.namespace, pod, &patch)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Child {
            action,
            kind: Pod::KIND,
            name: pod.to_string(),
            source,
        }),
    }
}

/// Deletes `pod` (bound to its `uid`: never its replacement) so that its StatefulSet makes
/// it again from the new template.
async fn replace_pod(
    ctx: &Context,
    db: &DatabaseCluster,
    names: &Names,
    pod: &str,
    uid: &str,
    primary: bool,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(pod, &params).await {
        Ok(_) => {
            announce(ctx, db, &events::replacing(pod, primary)).await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(source) => Err(Error::Child {
            action: "delete",
            kind: Pod::KIND,
            name: pod.to_string(),
            source,
        }),
    }
}
