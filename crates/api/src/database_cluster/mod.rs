//! The `DatabaseCluster` resource. `v1beta1` is the storage version; `v1alpha1`, the first
//! shape, is served beside it (deprecated) through the operator's conversion webhook.

pub mod admission;
pub mod conversion;
pub mod v1alpha1;
pub mod v1beta1;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use v1beta1::{
    BackupDestination, BackupSpec, BootstrapSpec, DatabaseCluster, DatabaseClusterSpec,
    DatabaseClusterStatus, Engine, FailoverReason, FailoverRecord, HighAvailabilitySpec,
    InstanceSummary, MajorUpgradeStatus, MajorUpgradeStep, Phase, RecoverySource, RecoverySpec,
    ReplicationSpec, SynchronousMethod, SynchronousSpec, UpgradeMethod, UpgradeSpec,
    parse_duration,
};

/// The finalizer the operator puts on every DatabaseCluster.
pub const FINALIZER: &str = "db.devctl.io/finalizer";

/// Annotation on a DatabaseCluster: `"true"` keeps its PersistentVolumeClaims (its data) when
/// the cluster is deleted; without it the operator deletes them with the cluster
/// (`devctl db delete --keep-volumes` sets it before deleting).
pub const KEEP_VOLUMES_ANNOTATION: &str = "db.devctl.io/keep-volumes";

/// Whether `annotations` ask to keep the volumes ([`KEEP_VOLUMES_ANNOTATION`] is `"true"`).
pub fn keeps_volumes(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    annotations
        .get(KEEP_VOLUMES_ANNOTATION)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Where the API server sends conversion requests in an installed operator: the webhook
/// Service in the operator's namespace. The operator replaces the client configuration with
/// its URL when it runs with `--webhook-url`, and injects the CA either way.
pub const CONVERSION_SERVICE_NAMESPACE: &str = "devctl-system";
pub const CONVERSION_SERVICE_NAME: &str = "devctl-operator-webhook";
pub const CONVERSION_PATH: &str = "/convert";

/// The CRD, generated from the Rust types: `v1beta1` (stored) and `v1alpha1` (deprecated),
/// converted by the operator's webhook.
pub fn crd() -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceConversion, ServiceReference, WebhookClientConfig, WebhookConversion,
    };
    let versions = vec![
        v1beta1::DatabaseCluster::crd(),
        v1alpha1::DatabaseCluster::crd(),
    ];
    // Infallible for these two: same group, kind and scope, one version each (a unit test
    // merges them).
    let mut crd = kube::core::crd::merge_crds(versions, "v1beta1")
        .unwrap_or_else(|_| v1beta1::DatabaseCluster::crd());
    crd.spec.conversion = Some(CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            conversion_review_versions: vec!["v1".into()],
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: CONVERSION_SERVICE_NAMESPACE.into(),
                    name: CONVERSION_SERVICE_NAME.into(),
                    path: Some(CONVERSION_PATH.into()),
                    port: Some(443),
                }),
                ..WebhookClientConfig::default()
            }),
        }),
    });
    crate::with_unobserved_status_default(crd)
}

/// A `major.minor` engine version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl std::str::FromStr for Version {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (major, minor) = s
            .split_once('.')
            .ok_or_else(|| format!("version {s:?} is not major.minor"))?;
        let parse = |p: &str| {
            p.parse::<u32>()
                .map_err(|_| format!("version {s:?} is not major.minor"))
        };
        Ok(Self {
            major: parse(major)?,
            minor: parse(minor)?,
        })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a version change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionChangeError {
    #[error(
        "downgrade from {from} to {to} is not supported: data files are not backwards compatible"
    )]
    Downgrade { from: Version, to: Version },
    #[error(
        "major version upgrade from {from} to {to} is not done in place for this engine (PostgreSQL only): dump and restore into a new cluster"
    )]
    MajorUpgrade { from: Version, to: Version },
    #[error("{0}")]
    Invalid(String),
}

/// Checks a change from the running version to the requested one: same version and minor
/// upgrades are allowed, and a higher major (skipping majors too) where the engine upgrades
/// in place (PostgreSQL, `pg_upgrade`); downgrades are refused.
pub fn check_version_change(
    engine: Engine,
    running: &str,
    requested: &str,
) -> Result<(), VersionChangeError> {
    let from: Version = running.parse().map_err(VersionChangeError::Invalid)?;
    let to: Version = requested.parse().map_err(VersionChangeError::Invalid)?;
    if to < from {
        Err(VersionChangeError::Downgrade { from, to })
    } else if to.major != from.major && engine != Engine::Postgres {
        Err(VersionChangeError::MajorUpgrade { from, to })
    } else if engine == Engine::Mariadb && to != from {
        // MariaDB's release series (10.11, 11.4) are its major versions.
        Err(VersionChangeError::MajorUpgrade { from, to })
    } else {
        Ok(())
    }
}

/// The majors of a change from `running` to `requested` when it crosses one upward.
pub fn major_upgrade(running: &str, requested: &str) -> Option<(u32, u32)> {
    let from: Version = running.parse().ok()?;
    let to: Version = requested.parse().ok()?;
    (to.major > from.major).then_some((from.major, to.major))
}

impl DatabaseClusterSpec {
    /// The container image: `spec.image`, or the engine's official image at `spec.version`.
    pub fn image(&self) -> String {
        match &self.image {
            Some(image) => image.clone(),
            None => format!("{}:{}", self.engine.as_str(), self.version),
        }
    }

    /// The database port of the engine.
    pub fn port(&self) -> i32 {
        match self.engine {
            Engine::Postgres => 5432,
            Engine::Mysql | Engine::Mariadb => 3306,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_and_postgres_major_upgrades_pass_downgrades_are_refused() {
        let pg = Engine::Postgres;
        assert_eq!(check_version_change(pg, "16.2", "16.2"), Ok(()));
        assert_eq!(check_version_change(pg, "16.2", "16.4"), Ok(()));
        assert!(matches!(
            check_version_change(pg, "16.4", "16.2"),
            Err(VersionChangeError::Downgrade { .. })
        ));
        // In place with pg_upgrade, skipping majors too.
        assert_eq!(check_version_change(pg, "15.4", "17.0"), Ok(()));
        assert_eq!(major_upgrade("15.4", "17.0"), Some((15, 17)));
        assert_eq!(major_upgrade("15.4", "15.9"), None);
        assert!(matches!(
            check_version_change(Engine::Mysql, "8.0", "8.4"),
            Ok(())
        ));
        assert!(matches!(
            check_version_change(Engine::Mysql, "8.4", "9.1"),
            Err(VersionChangeError::MajorUpgrade { .. })
        ));
        assert!(matches!(
            check_version_change(pg, "16.2", "15.9"),
            Err(VersionChangeError::Downgrade { .. })
        ));
        // Numeric, not lexical: 16.10 is newer than 16.9.
        assert_eq!(check_version_change(pg, "16.9", "16.10"), Ok(()));
    }

    #[test]
    fn crd_has_the_names_columns_and_scale_subresource() {
        let crd = crd();
        let spec = &crd.spec;
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("databaseclusters.db.devctl.io")
        );
        assert_eq!(
            spec.names.short_names.as_deref(),
            Some(&["dbc".to_string(), "db".to_string()][..])
        );
        assert_eq!(
            spec.names.categories.as_deref(),
            Some(&["all".to_string(), "devctl".to_string()][..])
        );
        let version = spec.versions.iter().find(|v| v.name == "v1beta1").unwrap();
        assert!(version.storage);
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            ["Engine", "Version", "Replicas", "Ready", "Phase", "Age"]
        );
        let scale = version
            .subresources
            .as_ref()
            .unwrap()
            .scale
            .as_ref()
            .unwrap();
        assert_eq!(
            scale.label_selector_path.as_deref(),
            Some(".status.selector")
        );
        let alpha = spec.versions.iter().find(|v| v.name == "v1alpha1").unwrap();
        assert!(alpha.served && !alpha.storage);
        assert_eq!(alpha.deprecated, Some(true));
        assert_eq!(
            alpha.deprecation_warning.as_deref(),
            Some(v1alpha1::DEPRECATION_WARNING)
        );
        let conversion = spec.conversion.as_ref().unwrap();
        assert_eq!(conversion.strategy, "Webhook");
    }
}
