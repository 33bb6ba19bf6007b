//! Admission rules the CRD schema and CEL cannot express (pure; the operator's validating
//! and mutating webhooks call them). Rules the schema already enforces — engine and
//! storage-class immutability, no shrinking, the quorum rule on `v1beta1` — stay there; the
//! webhook adds what needs the old object's meaning, a configurable minimum, or reaches
//! objects written through `v1alpha1` (whose schema cannot see `highAvailability`).

use serde_json::{Value, json};

use super::v1beta1::{DatabaseClusterSpec, Engine};
use super::{VersionChangeError, check_version_change};
use crate::quantity;

/// Settings of the admission rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// The smallest `spec.storage.size` accepted (a quantity, e.g. `1Gi`).
    pub min_storage: String,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        Self {
            min_storage: DEFAULT_MIN_STORAGE.into(),
        }
    }
}

/// The default of `--webhook-min-storage`.
pub const DEFAULT_MIN_STORAGE: &str = "1Gi";

/// One refused field: its path and why, shown to the user as `path: message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The CPU and memory requests a database container gets when `spec.resources` sets none;
/// the operator renders the same values for objects admitted without the webhook.
pub fn default_requests(engine: Engine) -> [(&'static str, &'static str); 2] {
    match engine {
        Engine::Postgres => [("cpu", "250m"), ("memory", "512Mi")],
        Engine::Mysql | Engine::Mariadb => [("cpu", "250m"), ("memory", "512Mi")],
    }
}

/// The requests `spec.resources` lacks, with the values they default to: the engine's default
/// request, or the container's limit when that is lower — a request above its limit makes the
/// pod template invalid, and Kubernetes itself defaults a missing request to the limit.
pub fn missing_requests(spec: &DatabaseClusterSpec) -> Vec<(&'static str, String)> {
    let resources = spec.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    default_requests(spec.engine)
        .into_iter()
        .filter(|(key, _)| !requests.is_some_and(|r| r.contains_key(*key)))
        .map(|(key, default)| {
            let amount = |q: &str| match key {
                "cpu" => crate::quantity::to_millicores(q),
                _ => crate::quantity::to_bytes(q),
            };
            let limit = limits.and_then(|l| l.get(key)).map(|q| q.0.as_str());
            let value = match limit {
                Some(limit)
                    if amount(limit)
                        .zip(amount(default))
                        .is_some_and(|(l, d)| l < d) =>
                {
                    limit.to_string()
                }
                _ => default.to_string(),
            };
            (key, value)
        })
        .collect()
}

/// What the validating webhook knows of the request besides the new spec.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request<'a> {
    /// The stored object's spec, on an update.
    pub old: Option<&'a DatabaseClusterSpec>,
    /// The version every instance runs (`status.currentVersion`), when known.
    pub running_version: Option<&'a str>,
    /// The client wrote through `db.devctl.io/v1alpha1`.
    pub via_v1alpha1: bool,
    /// A major version upgrade is under way (`status.majorUpgrade`, not refused or failed).
    pub upgrading: bool,
}

/// Checks a new spec; every refused field, in the order of the spec.
pub fn validate(
    spec: &DatabaseClusterSpec,
    request: Request<'_>,
    settings: &AdmissionSettings,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let old = request.old;
    if request.via_v1alpha1 {
        // v1alpha1's schema cannot check what it cannot express (it travels in an
        // annotation): such fields keep their stored values, or are absent on create.
        let before = old.map(super::conversion::hidden_in_v1alpha1);
        let after = super::conversion::hidden_in_v1alpha1(spec);
        let unchanged = before.map_or_else(
            || after.as_object().is_none_or(|m| m.is_empty()),
            |b| b == after,
        );
        if !unchanged {
            errors.push(FieldError {
                field: "metadata.annotations[db.devctl.io/v1beta1-fields]",
                message: "image, resource limits, backup settings other than backupsEnabled, highAvailability, replication, bootstrap and upgrade cannot be set or changed through db.devctl.io/v1alpha1; use db.devctl.io/v1beta1".into(),
            });
        }
    }
    if let Some(old) = old
        && old.version != spec.version
    {
        // From what runs: setting the version back to the running one is always allowed.
        let running = request.running_version.unwrap_or(&old.version);
        if running != spec.version
            && let Err(error) = check_version_change(spec.engine, running, &spec.version)
        {
            let message = match error {
                VersionChangeError::Invalid(message) => message,
                refused => format!("{refused}; keep {running}"),
            };
            errors.push(FieldError {
                field: "spec.version",
                message,
            });
        } else if let Some((from, to)) = super::major_upgrade(running, &spec.version)
            && spec.image.is_some()
        {
            errors.push(FieldError {
                field: "spec.image",
                message: format!(
                    "a major version upgrade ({from} to {to}) with spec.image set is not supported: remove spec.image (the official postgres image of spec.version runs) or dump and restore into a new cluster"
                ),
            });
        } else if let Some((from, to)) = super::major_upgrade(running, &spec.version)
            && old.replicas != spec.replicas
        {
            errors.push(FieldError {
                field: "spec.replicas",
                message: format!(
                    "a major version upgrade ({from} to {to}) and a change of spec.replicas ({} to {}) at once: one at a time; keep spec.replicas {} until the upgrade completes",
                    old.replicas, spec.replicas, old.replicas
                ),
            });
        }
    }
    // A major upgrade under way: its image stays (both versions would render a new one).
    if let Some(old) = old
        && request.upgrading
        && old.image != spec.image
    {
        errors.push(FieldError {
            field: "spec.image",
            message:
                "cannot change while a major version upgrade is under way (status.majorUpgrade)"
                    .into(),
        });
    }
    // A major upgrade under way: its target stays until it completes (or is refused).
    if let Some(old) = old
        && old.version != spec.version
        && let Some(running) = request.running_version
        && super::major_upgrade(running, &old.version).is_some()
        && super::major_upgrade(running, &spec.version).is_some()
        && request.upgrading
    {
        errors.push(FieldError {
            field: "spec.version",
            message: format!(
                "a major version upgrade from {running} to {} is under way: change spec.version once it completes (status.majorUpgrade)",
                old.version
            ),
        });
    }
    errors.extend(mariadb_errors(spec, old));
    let high_availability = spec.high_availability.as_ref().is_some_and(|h| h.enabled);
    let was_highly_available = old
        .and_then(|o| o.high_availability.as_ref())
        .is_some_and(|h| h.enabled);
    if high_availability && (spec.replicas < 3 || spec.replicas % 2 == 0) {
        errors.push(FieldError {
            field: "spec.replicas",
            message: format!(
                "must be odd and at least 3 when spec.highAvailability.enabled is true (got {}): a majority of the instances must survive a failure",
                spec.replicas
            ),
        });
    } else if high_availability
        && was_highly_available
        && let Some(old) = old
        && spec.replicas < majority(old.replicas)
    {
        // The smallest odd count that keeps a majority of the current members.
        let step = majority(old.replicas) | 1;
        errors.push(FieldError {
            field: "spec.replicas",
            message: format!(
                "scaling a highly available cluster from {} to {} instances at once would leave fewer than a majority ({}) of its members; scale to {step} first",
                old.replicas,
                spec.replicas,
                majority(old.replicas),
            ),
        });
    }
    // On create and when the size changes: a raised minimum never blocks other edits.
    let size_changed = old.is_none_or(|o| o.storage.size != spec.storage.size);
    match (
        quantity::to_bytes(&spec.storage.size),
        quantity::to_bytes(&settings.min_storage),
    ) {
        (Some(size), Some(min)) if size_changed && size < min => errors.push(FieldError {
            field: "spec.storage.size",
            message: format!(
                "{} is below the minimum of {} (a database volume smaller than that fills up with WAL and logs)",
                spec.storage.size, settings.min_storage
            ),
        }),
        _ => {}
    }
    errors
}

/// MariaDB's own limits: the release series devctl runs (10.11 and 11.x), and semi-synchronous
/// replication, which waits for one replica's acknowledgement (MariaDB has no count).
fn mariadb_errors(
    spec: &DatabaseClusterSpec,
    old: Option<&DatabaseClusterSpec>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.engine != Engine::Mariadb {
        return errors;
    }
    let version_changed = old.is_none_or(|o| o.version != spec.version);
    if version_changed
        && let Ok(version) = spec.version.parse::<super::Version>()
        && !(version.major == 11 || (version.major == 10 && version.minor == 11))
    {
        errors.push(FieldError {
            field: "spec.version",
            message: format!("MariaDB {version} is not supported: use 10.11 or 11.x (e.g. 11.4)"),
        });
    }
    if let Some(sync) = spec
        .replication
        .as_ref()
        .and_then(|r| r.synchronous.as_ref())
        && sync.number != 1
    {
        errors.push(FieldError {
            field: "spec.replication.synchronous.number",
            message: format!(
                "must be 1 for MariaDB (got {}): semi-synchronous replication waits for one replica's acknowledgement",
                sync.number
            ),
        });
    }
    errors
}

fn majority(members: i32) -> i32 {
    members / 2 + 1
}

/// JSON Patch operations (RFC 6902) that fill in defaults depending on other fields: the
/// engine's CPU and memory requests when `spec.resources.requests` lacks them. Written into
/// the object, so a later change of the operator's defaults never restarts a database.
pub fn defaults(spec: &DatabaseClusterSpec) -> Vec<Value> {
    let missing = missing_requests(spec);
    if missing.is_empty() {
        return Vec::new();
    }
    let requests: serde_json::Map<String, Value> = missing
        .iter()
        .map(|(key, value)| (key.to_string(), json!(value)))
        .collect();
    match &spec.resources {
        None => vec![json!({ "op": "add", "path": "/spec/resources", "value": { "requests": requests } })],
        Some(resources) if resources.requests.is_none() => {
            vec![json!({ "op": "add", "path": "/spec/resources/requests", "value": requests })]
        }
        Some(_) => missing
            .iter()
            .map(|(key, value)| {
                json!({ "op": "add", "path": format!("/spec/resources/requests/{key}"), "value": value })
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database_cluster::HighAvailabilitySpec;

    fn update(old: &DatabaseClusterSpec) -> Request<'_> {
        Request {
            old: Some(old),
            ..Request::default()
        }
    }

    fn create() -> Request<'static> {
        Request::default()
    }

    #[test]
    fn the_running_version_is_the_baseline_and_going_back_to_it_is_allowed() {
        let mut old = spec(base());
        old.version = "17.0".into();
        let mut value = base();
        value["version"] = json!("16.4");
        let request = Request {
            old: Some(&old),
            running_version: Some("16.4"),
            via_v1alpha1: false,
            upgrading: false,
        };
        assert!(validate(&spec(value), request, &AdmissionSettings::default()).is_empty());
    }

    #[test]
    fn a_raised_storage_minimum_only_judges_new_sizes() {
        let mut old = spec(base());
        old.storage.size = "512Mi".into();
        let mut value = base();
        value["storage"]["size"] = json!("512Mi");
        value["replicas"] = json!(5);
        assert!(validate(&spec(value), update(&old), &AdmissionSettings::default()).is_empty());
    }

    #[test]
    fn v1alpha1_writes_keep_what_v1alpha1_cannot_show() {
        let mut old = spec(base());
        old.high_availability = Some(HighAvailabilitySpec {
            enabled: true,
            auto_failover: true,
            failover_timeout: "30s".into(),
        });
        let via = |old| Request {
            old,
            running_version: None,
            via_v1alpha1: true,
            upgrading: false,
        };
        // Unchanged hidden fields, a changed visible one: fine.
        let mut same = old.clone();
        same.replicas = 5;
        assert!(validate(&same, via(Some(&old)), &AdmissionSettings::default()).is_empty());
        // A changed hidden field (the annotation edited by hand): refused.
        let mut changed = old.clone();
        changed.high_availability.as_mut().unwrap().failover_timeout = "2s".into();
        let errors = validate(&changed, via(Some(&old)), &AdmissionSettings::default());
        assert!(
            errors[0]
                .message
                .contains("cannot be set or changed through db.devctl.io/v1alpha1")
        );
        // On create, plain v1alpha1 objects pass and hidden fields do not.
        assert!(validate(&spec(base()), via(None), &AdmissionSettings::default()).is_empty());
        assert_eq!(
            validate(&old, via(None), &AdmissionSettings::default()).len(),
            1
        );
    }

    #[test]
    fn a_stored_default_retention_is_no_hidden_field_for_v1alpha1_writes() {
        // Stored while the schema defaulted `retention` to 7.
        let mut value = base();
        value["backup"] = json!({ "enabled": true, "retention": 7 });
        let old = spec(value);
        let via = |old| Request {
            old,
            running_version: None,
            via_v1alpha1: true,
            upgrading: false,
        };
        // A v1alpha1 `backupsEnabled: true` write converts to the defaults (no retention).
        let mut value = base();
        value["backup"] = json!({ "enabled": true });
        let new = spec(value);
        assert!(validate(&new, via(Some(&old)), &AdmissionSettings::default()).is_empty());
        // With `keepLast`, 7 days is a rule of its own: changing it is still refused.
        let mut value = base();
        value["backup"] = json!({ "enabled": true, "retention": 7, "keepLast": 3 });
        let old = spec(value);
        let mut value = base();
        value["backup"] = json!({ "enabled": true, "keepLast": 3 });
        let new = spec(value);
        assert_eq!(
            validate(&new, via(Some(&old)), &AdmissionSettings::default()).len(),
            1
        );
    }

    fn spec(value: Value) -> DatabaseClusterSpec {
        serde_json::from_value(value).unwrap()
    }

    fn base() -> Value {
        json!({ "engine": "postgres", "version": "16.2", "replicas": 3, "storage": { "size": "10Gi" } })
    }

    #[test]
    fn storage_below_the_minimum_is_refused_with_the_field() {
        let mut value = base();
        value["storage"]["size"] = json!("512Mi");
        let errors = validate(
            &spec(value),
            Request::default(),
            &AdmissionSettings::default(),
        );
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "spec.storage.size: 512Mi is below the minimum of 1Gi (a database volume smaller than that fills up with WAL and logs)"
        );
        let settings = AdmissionSettings {
            min_storage: "20Gi".into(),
        };
        assert_eq!(
            validate(&spec(base()), Request::default(), &settings).len(),
            1
        );
        assert!(
            validate(
                &spec(base()),
                Request::default(),
                &AdmissionSettings::default()
            )
            .is_empty()
        );
    }

    #[test]
    fn downgrades_are_refused_on_update_and_majors_go_one_change_at_a_time() {
        let old = spec(base());
        let mut value = base();
        value["version"] = json!("16.1");
        let errors = validate(
            &spec(value.clone()),
            update(&old),
            &AdmissionSettings::default(),
        );
        assert_eq!(errors[0].field, "spec.version");
        assert!(
            errors[0].message.starts_with("downgrade from 16.2 to 16.1"),
            "{}",
            errors[0]
        );
        assert!(
            validate(
                &spec(value),
                Request::default(),
                &AdmissionSettings::default()
            )
            .is_empty()
        );
        // PostgreSQL upgrades majors in place (skipping some too), one change at a time.
        let mut value = base();
        value["version"] = json!("18.0");
        assert!(
            validate(
                &spec(value.clone()),
                update(&old),
                &AdmissionSettings::default()
            )
            .is_empty()
        );
        value["replicas"] = json!(5);
        let errors = validate(&spec(value), update(&old), &AdmissionSettings::default());
        assert_eq!(errors[0].field, "spec.replicas");
        assert!(errors[0].message.contains("one at a time"), "{}", errors[0]);
        // Not with an image of the user's: both versions would render it.
        let mut value = base();
        value["version"] = json!("17.0");
        value["image"] = json!("registry.example/pg:custom");
        let errors = validate(&spec(value), update(&old), &AdmissionSettings::default());
        assert_eq!(errors[0].field, "spec.image");
        // Not again while one is under way.
        let mut upgrading = old.clone();
        upgrading.version = "17.0".into();
        let mut value = base();
        value["version"] = json!("18.0");
        let request = Request {
            old: Some(&upgrading),
            running_version: Some("16.2"),
            upgrading: true,
            ..Request::default()
        };
        let errors = validate(&spec(value), request, &AdmissionSettings::default());
        assert!(errors[0].message.contains("is under way"), "{}", errors[0]);
        // The MySQL family does not.
        let mut value = base();
        value["engine"] = json!("mysql");
        value["version"] = json!("8.0");
        let mut mysql = spec(value.clone());
        let old_mysql = mysql.clone();
        mysql.version = "9.1".into();
        let errors = validate(&mysql, update(&old_mysql), &AdmissionSettings::default());
        assert!(
            errors[0].message.starts_with("major version upgrade"),
            "{}",
            errors[0]
        );
        let mut value = base();
        value["version"] = json!("16.4");
        assert!(validate(&spec(value), update(&old), &AdmissionSettings::default()).is_empty());
    }

    #[test]
    fn mariadb_runs_10_11_or_11_x_never_changes_series_and_acknowledges_with_one_replica() {
        let mariadb = |version: &str| {
            let mut value = base();
            value["engine"] = json!("mariadb");
            value["version"] = json!(version);
            spec(value)
        };
        let settings = AdmissionSettings::default();
        for ok in ["10.11", "11.4", "11.8"] {
            assert!(
                validate(&mariadb(ok), create(), &settings).is_empty(),
                "{ok}"
            );
        }
        let errors = validate(&mariadb("10.6"), create(), &settings);
        assert_eq!(errors[0].field, "spec.version");
        assert!(
            errors[0].message.contains("use 10.11 or 11.x"),
            "{}",
            errors[0]
        );
        // A series is a major version: 10.11 -> 11.4 (and 11.4 -> 11.8) refused.
        for (from, to) in [("10.11", "11.4"), ("11.4", "11.8")] {
            let old = mariadb(from);
            let errors = validate(&mariadb(to), update(&old), &settings);
            assert!(
                errors[0].message.starts_with("major version upgrade"),
                "{from} -> {to}: {:?}",
                errors
            );
        }
        let mut sync = mariadb("10.11");
        sync.replicas = 3;
        sync.replication = Some(crate::database_cluster::ReplicationSpec {
            synchronous: Some(crate::database_cluster::SynchronousSpec {
                method: crate::database_cluster::SynchronousMethod::Any,
                number: 2,
            }),
        });
        let errors = validate(&sync, create(), &settings);
        assert_eq!(errors[0].field, "spec.replication.synchronous.number");
    }

    #[test]
    fn high_availability_needs_an_odd_quorum_and_no_majority_loss_at_once() {
        let ha = |replicas: i32| {
            let mut s = spec(base());
            s.replicas = replicas;
            s.high_availability = Some(HighAvailabilitySpec {
                enabled: true,
                auto_failover: true,
                failover_timeout: "30s".into(),
            });
            s
        };
        let settings = AdmissionSettings::default();
        for replicas in [1, 2, 4, 6] {
            let errors = validate(&ha(replicas), Request::default(), &settings);
            assert_eq!(errors[0].field, "spec.replicas", "{replicas}");
        }
        for replicas in [3, 5, 7] {
            assert!(validate(&ha(replicas), Request::default(), &settings).is_empty());
        }
        assert!(validate(&ha(5), update(&ha(7)), &settings).is_empty());
        let errors = validate(&ha(3), update(&ha(7)), &settings);
        assert!(errors[0].message.contains("from 7 to 3"), "{}", errors[0]);
        assert!(
            errors[0].message.ends_with("scale to 5 first"),
            "{}",
            errors[0]
        );
        // Without high availability any count goes.
        let mut plain = spec(base());
        plain.replicas = 2;
        assert!(validate(&plain, Request::default(), &settings).is_empty());
    }

    #[test]
    fn defaults_fill_only_missing_requests() {
        assert_eq!(
            defaults(&spec(base())),
            vec![
                json!({ "op": "add", "path": "/spec/resources", "value": { "requests": { "cpu": "250m", "memory": "512Mi" } } })
            ]
        );
        let mut value = base();
        value["resources"] = json!({ "limits": { "memory": "1Gi" } });
        assert_eq!(
            defaults(&spec(value))[0]["path"],
            json!("/spec/resources/requests")
        );
        let mut value = base();
        value["resources"] = json!({ "requests": { "memory": "1Gi" } });
        assert_eq!(
            defaults(&spec(value)),
            vec![json!({ "op": "add", "path": "/spec/resources/requests/cpu", "value": "250m" })]
        );
        let mut value = base();
        value["resources"] = json!({ "requests": { "cpu": "1", "memory": "1Gi" } });
        assert!(defaults(&spec(value)).is_empty());
    }

    #[test]
    fn a_default_request_never_exceeds_the_limit() {
        let mut value = base();
        value["resources"] = json!({ "limits": { "cpu": "100m", "memory": "256Mi" } });
        assert_eq!(
            defaults(&spec(value)),
            vec![
                json!({ "op": "add", "path": "/spec/resources/requests", "value": { "cpu": "100m", "memory": "256Mi" } })
            ]
        );
        let mut value = base();
        value["resources"] = json!({ "limits": { "cpu": "2", "memory": "0.25Gi" } });
        assert_eq!(
            missing_requests(&spec(value)),
            vec![
                ("cpu", "250m".to_string()),
                ("memory", "0.25Gi".to_string())
            ]
        );
    }
}
