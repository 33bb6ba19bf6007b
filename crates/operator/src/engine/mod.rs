//! Engine configuration rendered from the requested resources (pure functions).
//!
//! Sizing follows the engines' common guidance: PostgreSQL gets ~25% of the memory for
//! shared_buffers and assumes ~75% is available as OS cache; MySQL/InnoDB gets 50% for the
//! buffer pool (the rest covers per-connection buffers and the OS). Memory is the container's
//! limit when set (that is what the kernel enforces), else its request.

pub mod mariadb;
pub mod mysql;
pub mod postgres;

use devctl_api::database_cluster::DatabaseClusterSpec;
use devctl_api::quantity;
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The memory assumed when nothing sets one (the engines' default request).
const DEFAULT_MEMORY_REQUEST: &str = "512Mi";

/// `spec.resources` with the engine's default requests filled in (the mutating webhook writes
/// the same defaults into admitted objects).
pub fn effective_resources(spec: &DatabaseClusterSpec) -> ResourceRequirements {
    let mut resources = spec.resources.clone().unwrap_or_default();
    let missing = devctl_api::database_cluster::admission::missing_requests(spec);
    let requests = resources.requests.get_or_insert_with(Default::default);
    for (key, value) in missing {
        requests.insert(key.into(), Quantity(value));
    }
    resources
}

/// The memory the database can count on, in MiB (limit, else request, else the default).
pub fn memory_mib(resources: &ResourceRequirements) -> u64 {
    let pick = |map: &Option<std::collections::BTreeMap<String, Quantity>>| {
        map.as_ref()
            .and_then(|m| m.get("memory"))
            .and_then(|q| quantity::to_bytes(&q.0))
    };
    let bytes = pick(&resources.limits)
        .or_else(|| pick(&resources.requests))
        .or_else(|| quantity::to_bytes(DEFAULT_MEMORY_REQUEST))
        .unwrap_or(512 * 1024 * 1024);
    (bytes / (1024 * 1024)).max(64)
}

/// Connections the memory supports: 100 up to 1 GiB, then +100 per GiB, at most 1000.
pub fn max_connections(memory_mib: u64) -> u64 {
    (memory_mib / 1024 * 100).clamp(100, 1000)
}

/// Renders the engine's configuration files (file name → content).
pub fn render(spec: &DatabaseClusterSpec) -> std::collections::BTreeMap<String, String> {
    let memory = memory_mib(&effective_resources(spec));
    match spec.engine {
        devctl_api::database_cluster::Engine::Postgres => {
            let storage = quantity::to_bytes(&spec.storage.size).unwrap_or(1024 * 1024 * 1024);
            postgres::render(memory, storage / (1024 * 1024))
        }
        devctl_api::database_cluster::Engine::Mysql => mysql::render(memory),
        devctl_api::database_cluster::Engine::Mariadb => mariadb::render(memory),
    }
}
