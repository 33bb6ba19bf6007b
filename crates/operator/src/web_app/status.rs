//! The status a WebApp should have, computed from its Deployment (pure).

use devctl_api::conditions::{self, Desired, FALSE, TRUE};

use crate::error::Failure;
use devctl_api::labels;
use devctl_api::web_app::{WebApp, WebAppStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::resources::selector;

pub const AVAILABLE: &str = "Available";
pub const CREATING: &str = "Creating";
pub const SCALING: &str = "Scaling";
pub const UPGRADING: &str = "Upgrading";
pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

fn deployment_condition<'a>(
    deployment: &'a Deployment,
    type_: &str,
) -> Option<&'a k8s_openapi::api::apps::v1::DeploymentCondition> {
    deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_.as_deref() == Some(type_))
}

/// What the reconcile saw and did.
pub struct Observed<'a> {
    pub deployment: Option<&'a Deployment>,
    /// The Deployment was created or updated by this reconcile: its cached status describes
    /// the previous spec.
    pub applied_now: bool,
    /// Why the reconcile failed.
    pub failure: Option<Failure>,
    /// Why one of the app's pods cannot run, when Kubernetes says so (unschedulable, an image
    /// that cannot be pulled, a missing Secret key).
    pub pod_blocker: Option<String>,
}

/// The image of the Deployment's pod template (the app's container).
fn template_image(deployment: &Deployment) -> Option<&str> {
    crate::children::template_image(&deployment.spec.template)
}

/// Whether the Deployment runs `app`'s spec: its own spec matches (image, replicas) and its
/// controller has rolled it out to every pod.
fn rolled_out(app: &WebApp, observed: &Observed<'_>) -> bool {
    let Some(deployment) = observed.deployment else {
        return false;
    };
    let want = app.spec.replicas;
    let spec_matches = deployment.spec.replicas == Some(want)
        && template_image(deployment) == Some(app.spec.image.as_str());
    let Some(status) = deployment.status.as_ref() else {
        return false;
    };
    !observed.applied_now
        && spec_matches
        && status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas.unwrap_or(0) == want
        && status.replicas.unwrap_or(0) == want
        && status.available_replicas.unwrap_or(0) == want
        && status.ready_replicas.unwrap_or(0) == want
}

/// The Deployment's controller stopped the rollout (`Progressing=False`,
/// `ProgressDeadlineExceeded`): its message.
/// Only a Deployment whose controller has seen its current spec counts: the reconcile that
/// applies a fix still caches the verdict on the spec before it.
fn deadline_exceeded(observed: &Observed<'_>) -> Option<String> {
    let deployment = observed.deployment?;
    let seen = deployment
        .status
        .as_ref()
        .is_some_and(|s| s.observed_generation >= deployment.metadata.generation);
    if observed.applied_now || !seen {
        return None;
    }
    let condition = deployment_condition(deployment, conditions::PROGRESSING)?;
    (condition.status.as_deref() == Some(FALSE)
        && condition.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED))
    .then(|| condition.message.clone().unwrap_or_default())
}

/// Why the declared state is not reached yet, as kstatus readers and `kubectl wait` show it:
/// the Deployment is being made, its pods are being replaced by the new template
/// (`Upgrading`), or their number is changing (`Scaling`). A rollout the cache has not seen
/// yet (`applied_now`) is told from the spec against the Deployment as it was. Once a
/// change's reason is shown it stays until the change is done (the Deployment's own counts
/// pass through states that would read otherwise).
fn rollout_reason(app: &WebApp, observed: &Observed<'_>, previous: Option<&str>) -> &'static str {
    let known = |reason: &str| {
        [CREATING, SCALING, UPGRADING]
            .into_iter()
            .find(|r| *r == reason)
    };
    match (fresh_reason(app, observed), previous.and_then(known)) {
        (Some(reason), _) => reason,
        (None, Some(previous)) => previous,
        (None, None) => SCALING,
    }
}

/// What the Deployment shows of the change under way, when it shows it.
fn fresh_reason(app: &WebApp, observed: &Observed<'_>) -> Option<&'static str> {
    let Some(deployment) = observed.deployment else {
        return Some(CREATING);
    };
    if template_image(deployment) != Some(app.spec.image.as_str()) {
        return Some(UPGRADING);
    }
    let status = deployment.status.as_ref()?;
    let new_template_rolling = !observed.applied_now
        && status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas.unwrap_or(0) < status.replicas.unwrap_or(0);
    if new_template_rolling {
        return Some(UPGRADING);
    }
    if deployment.spec.replicas != Some(app.spec.replicas) {
        return Some(SCALING);
    }
    None
}

/// Where a WebApp stands against its spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The declared state is reached.
    Done,
    /// Being rolled out, or retried after an error.
    InProgress,
    /// Only a human moves it on.
    Stalled,
}

pub fn compute(app: &WebApp, observed: &Observed<'_>, now: &Time) -> WebAppStatus {
    let previous = app.status.clone().unwrap_or_default();
    let want = app.spec.replicas;
    let deployment = observed.deployment;
    let status = deployment.and_then(|d| d.status.as_ref());
    let replicas = status.and_then(|s| s.replicas).unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let available = status.and_then(|s| s.available_replicas).unwrap_or(0);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(0);
    let rolled_out = rolled_out(app, observed);

    let available_condition = match deployment.and_then(|d| deployment_condition(d, "Available")) {
        Some(c) if c.status.as_deref() == Some("True") => Desired::new(
            AVAILABLE,
            TRUE,
            "MinimumReplicasAvailable",
            format!("{available}/{want} pods available"),
        ),
        Some(c) => Desired::new(
            AVAILABLE,
            FALSE,
            c.reason.clone().unwrap_or_else(|| "Unavailable".into()),
            c.message.clone().unwrap_or_default(),
        ),
        None => Desired::new(
            AVAILABLE,
            FALSE,
            "Creating",
            "the Deployment has no status yet",
        ),
    };
    let progress = format!("{ready}/{want} pods ready, {updated} up to date");
    // What holds the rollout up, said as soon as Kubernetes says it rather than at the
    // Deployment's progress deadline (ten minutes by default).
    let held_up = |message: String| match &observed.pod_blocker {
        Some(blocker) => format!("{message}; {blocker}"),
        None => message,
    };
    // Where the WebApp stands; `Ready`, `Progressing` and kstatus's pair all follow from it.
    let (reason, message, state) = match &observed.failure {
        Some(failure) if failure.permanent => {
            (failure.reason, failure.message.clone(), State::Stalled)
        }
        // A retried error is still under way (as `Reconciling` says).
        Some(failure) => (failure.reason, failure.message.clone(), State::InProgress),
        None if rolled_out => ("Ready", progress, State::Done),
        None => match deadline_exceeded(observed) {
            // The Deployment's controller gave up on the rollout: it needs a human (a bad
            // image, a quota), whatever is retried here.
            Some(why) => (
                PROGRESS_DEADLINE_EXCEEDED,
                held_up(format!("the rollout stopped: {why}")),
                State::Stalled,
            ),
            None => {
                let previous_reason = conditions::find(&previous.conditions, conditions::READY)
                    .map(|c| c.reason.as_str());
                (
                    rollout_reason(app, observed, previous_reason),
                    held_up(progress),
                    State::InProgress,
                )
            }
        },
    };
    let mut desired = vec![available_condition];
    match state {
        State::Done => {
            desired.push(Desired::new(conditions::READY, TRUE, reason, message));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                FALSE,
                "Converged",
                "every child matches the spec",
            ));
            desired.extend(conditions::kstatus(None, None));
        }
        State::InProgress | State::Stalled => {
            let under_way = state == State::InProgress;
            desired.push(Desired::new(
                conditions::READY,
                FALSE,
                reason,
                message.clone(),
            ));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                if under_way { TRUE } else { FALSE },
                reason,
                message.clone(),
            ));
            let pair = Some((reason, message.as_str()));
            desired.extend(match under_way {
                true => conditions::kstatus(pair, None),
                false => conditions::kstatus(None, pair),
            });
        }
    }

    WebAppStatus {
        replicas,
        ready_replicas: ready,
        available_replicas: available,
        selector: Some(labels::to_selector_string(&selector(app))),
        observed_generation: app.metadata.generation,
        conditions: conditions::merge(&previous.conditions, &desired, app.metadata.generation, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn observed(deployment: Option<&Deployment>) -> Observed<'_> {
        Observed {
            deployment,
            applied_now: false,
            failure: None,
            pod_blocker: None,
        }
    }

    fn deployment(ready: i32) -> Deployment {
        serde_json::from_value(json!({
            "metadata": { "name": "my-service-deployment", "generation": 1 },
            "spec": { "replicas": 5, "selector": {}, "template": { "spec": { "containers": [
                { "name": "app", "image": "myregistry/myapp:v2.1.0" }
            ] } } },
            "status": {
                "observedGeneration": 1, "replicas": 5, "readyReplicas": ready, "availableReplicas": ready,
                "updatedReplicas": 5,
                "conditions": [{ "type": "Available", "status": if ready == 5 { "True" } else { "False" }, "reason": "MinimumReplicasAvailable" }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn available_and_ready_when_every_pod_is() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let app = super::super::resources::sample();
        let d = deployment(5);
        let status = compute(&app, &observed(Some(&d)), &now);
        assert_eq!(status.ready_replicas, 5);
        let find = |t: &str| {
            conditions::find(&status.conditions, t)
                .unwrap()
                .status
                .clone()
        };
        assert_eq!(
            (find("Available"), find("Ready"), find("Progressing")),
            ("True".into(), "True".into(), "False".into())
        );
        let mut converged = app.clone();
        converged.status = Some(status.clone());
        let later = Time(Timestamp::from_second(99).unwrap());
        assert_eq!(
            compute(&converged, &observed(Some(&d)), &later),
            status,
            "no write in steady state"
        );
    }

    #[test]
    fn a_deployment_applied_in_this_reconcile_is_not_rolled_out_yet() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let app = super::super::resources::sample();
        let d = deployment(5);
        let mut fresh = observed(Some(&d));
        fresh.applied_now = true;
        let status = compute(&app, &fresh, &now);
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(find("Ready").status, "False");
        assert_eq!(find("Reconciling").status, "True");
        let mut new_image = app.clone();
        new_image.spec.image = "myregistry/myapp:v2.2.0".into();
        let status = compute(&new_image, &observed(Some(&d)), &now);
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(
            find("Ready").status,
            "False",
            "the cached Deployment runs the old image"
        );
        assert_eq!(find("Reconciling").reason, "Upgrading");
        assert_eq!(find("Ready").reason, "Upgrading");
    }

    #[test]
    fn a_replica_change_is_scaling_and_a_new_image_upgrading() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let app = super::super::resources::sample();
        let d = deployment(5);
        let reasons = |app: &WebApp, observed: &Observed<'_>| {
            let status = compute(app, observed, &now);
            let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
            (
                find("Ready").reason,
                find("Progressing").reason,
                find("Reconciling").reason,
            )
        };
        let scaling = |r: &str| (r.to_string(), r.to_string(), r.to_string());
        let mut more = app.clone();
        more.spec.replicas = 7;
        // The status write of the reconcile that applies the change, and the later ones
        // while the Deployment's controller works on it.
        let mut fresh = observed(Some(&d));
        fresh.applied_now = true;
        assert_eq!(reasons(&more, &fresh), scaling("Scaling"));
        let mut scaled = d.clone();
        scaled.spec.replicas = Some(7);
        assert_eq!(reasons(&more, &observed(Some(&scaled))), scaling("Scaling"));
        let mut new_image = app.clone();
        new_image.spec.image = "myregistry/myapp:v2.2.0".into();
        assert_eq!(reasons(&new_image, &fresh), scaling("Upgrading"));
        let mut rolling = d.clone();
        rolling.spec.template.spec.as_mut().unwrap().containers[0].image =
            Some("myregistry/myapp:v2.2.0".into());
        rolling.status.as_mut().unwrap().updated_replicas = Some(2);
        assert_eq!(
            reasons(&new_image, &observed(Some(&rolling))),
            scaling("Upgrading")
        );
        assert_eq!(reasons(&app, &observed(None)), scaling("Creating"));
    }

    #[test]
    fn a_rollout_past_its_deadline_is_stalled() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let mut d = deployment(2);
        d.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(
                serde_json::from_value(json!({
                    "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                    "message": "ReplicaSet \"x\" has timed out progressing."
                }))
                .unwrap(),
            );
        let status = compute(
            &super::super::resources::sample(),
            &observed(Some(&d)),
            &now,
        );
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(
            (
                find("Stalled").status.as_str(),
                find("Stalled").reason.as_str()
            ),
            ("True", "ProgressDeadlineExceeded")
        );
        assert!(find("Stalled").message.contains("timed out progressing"));
        assert_eq!(find("Reconciling").status, "False");
        assert_eq!(find("Ready").status, "False");
        // The reconcile that applies a fix still caches the old verdict: in progress, not
        // failed, from the write that records the new generation.
        let mut fixing = observed(Some(&d));
        fixing.applied_now = true;
        let status = compute(&super::super::resources::sample(), &fixing, &now);
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(find("Stalled").status, "False");
        assert_eq!(find("Reconciling").status, "True");
    }

    #[test]
    fn a_permanent_failure_is_stalled() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let mut o = observed(None);
        o.failure = Some(Failure {
            reason: "Forbidden",
            message: "apply Deployment x: denied by policy".into(),
            permanent: true,
        });
        let status = compute(&super::super::resources::sample(), &o, &now);
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(
            (
                find("Stalled").status.as_str(),
                find("Stalled").reason.as_str()
            ),
            ("True", "Forbidden")
        );
        assert_eq!(find("Reconciling").status, "False");
        assert_eq!(find("Ready").status, "False");
    }

    #[test]
    fn progressing_while_pods_start() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let d = deployment(2);
        let status = compute(
            &super::super::resources::sample(),
            &observed(Some(&d)),
            &now,
        );
        assert_eq!(
            conditions::find(&status.conditions, "Progressing")
                .unwrap()
                .status,
            "True"
        );
        assert_eq!(
            conditions::find(&status.conditions, "Ready")
                .unwrap()
                .status,
            "False"
        );
    }

    #[test]
    fn a_pod_that_cannot_run_is_named_while_the_rollout_waits() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let d = deployment(2);
        let mut o = observed(Some(&d));
        o.pod_blocker =
            Some("pod web-1: the pod cannot be scheduled: 0/2 nodes are available".into());
        let status = compute(&super::super::resources::sample(), &o, &now);
        let find = |t: &str| conditions::find(&status.conditions, t).unwrap().clone();
        assert_eq!(find("Progressing").status, "True");
        assert_eq!(find("Ready").status, "False");
        assert_eq!(
            find("Ready").message,
            "2/5 pods ready, 5 up to date; pod web-1: the pod cannot be scheduled: 0/2 nodes are available"
        );
        // Rolled out: nothing holds it up, whatever a leftover pod says.
        let done = deployment(5);
        let mut o = observed(Some(&done));
        o.pod_blocker = Some("pod web-9: stuck".into());
        let status = compute(&super::super::resources::sample(), &o, &now);
        let ready = conditions::find(&status.conditions, "Ready").unwrap();
        assert!(!ready.message.contains("stuck"), "{ready:?}");
    }
}
