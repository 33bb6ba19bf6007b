//! The status a WebApp should have, computed from its Deployment (pure).

use devctl_api::conditions::{self, Desired, FALSE, TRUE};
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

pub fn compute(
    app: &WebApp,
    deployment: Option<&Deployment>,
    error: Option<(&'static str, String)>,
    now: &Time,
) -> WebAppStatus {
    let previous = app.status.clone().unwrap_or_default();
    let want = app.spec.replicas;
    let status = deployment.and_then(|d| d.status.as_ref());
    let replicas = status.and_then(|s| s.replicas).unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let available = status.and_then(|s| s.available_replicas).unwrap_or(0);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(0);
    let generation_seen = deployment
        .is_some_and(|d| status.and_then(|s| s.observed_generation) >= d.metadata.generation);
    let rolled_out = generation_seen && updated == want && replicas == want && available == want;

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
    match error {
        Some((reason, message)) => {
            desired.push(Desired::new(
                conditions::READY,
                FALSE,
                reason,
                message.clone(),
            ));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                FALSE,
                reason,
                message,
            ));
        }
        None if rolled_out && ready == want => {
            desired.push(Desired::new(conditions::READY, TRUE, "Ready", progress));
            desired.push(Desired::new(
                conditions::PROGRESSING,
                FALSE,
                "Converged",
                "every child matches the spec",
            ));
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
                progress,
            ));
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

    fn deployment(ready: i32) -> Deployment {
        serde_json::from_value(json!({
            "metadata": { "name": "my-service-deployment", "generation": 1 },
            "spec": { "selector": {}, "template": {} },
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
        let status = compute(&app, Some(&d), None, &now);
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
            compute(&converged, Some(&d), None, &later),
            status,
            "no write in steady state"
        );
    }

    #[test]
    fn progressing_while_pods_start() {
        let now = Time(Timestamp::from_second(10).unwrap());
        let d = deployment(2);
        let status = compute(&super::super::resources::sample(), Some(&d), None, &now);
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
