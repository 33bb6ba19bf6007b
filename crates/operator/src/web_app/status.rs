//! The status a WebApp should have, computed from its Deployment (pure).

use devctl_api::conditions::{self, Desired, FALSE, TRUE};

use crate::error::Failure;
use devctl_api::labels;
use devctl_api::web_app::{WebApp, WebAppStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::resources::selector;

pub const AVAILABLE: &str = "Available";

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
}

/// Whether the Deployment runs `app`'s spec: its own spec matches (image, replicas) and its
/// controller has rolled it out to every pod.
fn rolled_out(app: &WebApp, observed: &Observed<'_>) -> bool {
    let Some(deployment) = observed.deployment else {
        return false;
    };
    let want = app.spec.replicas;
    let spec_matches = deployment.spec.replicas == Some(want)
        && deployment
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.containers.first())
            .and_then(|c| c.image.as_deref())
            == Some(app.spec.image.as_str());
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
    let mut desired = vec![available_condition];
    let (in_progress, stalled) = match &observed.failure {
        Some(failure) => {
            desired.push(Desired::new(
                conditions::READY,
                FALSE,
                failure.reason,
                failure.message.clone(),
            ));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                FALSE,
                failure.reason,
                failure.message.clone(),
            ));
            match failure.permanent {
                true => (None, Some((failure.reason, failure.message.as_str()))),
                false => (Some((failure.reason, failure.message.as_str())), None),
            }
        }
        None if rolled_out => {
            desired.push(Desired::new(
                conditions::READY,
                TRUE,
                "Ready",
                progress.clone(),
            ));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                FALSE,
                "Converged",
                "every child matches the spec",
            ));
            (None, None)
        }
        None => {
            desired.push(Desired::new(
                conditions::READY,
                FALSE,
                "RollingOut",
                progress.clone(),
            ));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                TRUE,
                "RollingOut",
                progress.clone(),
            ));
            (Some(("RollingOut", progress.as_str())), None)
        }
    };
    desired.extend(conditions::kstatus(in_progress, stalled));

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
        assert_eq!(find("Reconciling").reason, "RollingOut");
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
}
