//! `<name>-credentials`: generated once, never regenerated, never logged.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use devctl_api::database_cluster::{DatabaseCluster, Engine};
use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::json;

use super::{Inputs, Names, metadata};
use k8s_openapi::api::core::v1::Secret;

use crate::children::Child;
use crate::error::Result;

/// The database user the applications connect as: an ordinary role owning the database
/// `app`, never the superuser (the agent alone administers the engine, over a private
/// socket).
pub fn username(_engine: Engine) -> &'static str {
    "app"
}

pub const DATABASE: &str = "app";

/// A 32-character alphanumeric password (~190 bits) from the OS CSPRNG; alphanumeric so it
/// needs no escaping in URIs, shells or config files.
pub fn generate_password() -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(32)
        .map(char::from)
        .collect()
}

/// The password stored in an existing Secret's `password` key.
pub fn existing_password(secret: &k8s_openapi::api::core::v1::Secret) -> Option<String> {
    let bytes = secret.data.as_ref()?.get("password")?;
    String::from_utf8(bytes.0.clone())
        .ok()
        .filter(|p| !p.is_empty())
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Child> {
    let name = names.secret();
    let engine = db.spec.engine;
    let user = username(engine);
    let host = names.dns(&names.read_write_service(), inputs.cluster_domain);
    let port = db.spec.port();
    let scheme = match engine {
        Engine::Postgres => "postgresql",
        Engine::Mysql => "mysql",
    };
    let uri = format!(
        "{scheme}://{user}:{}@{host}:{port}/{DATABASE}",
        inputs.password
    );
    // `data` (base64), not `stringData`: the server stores `data`, and comparing like with
    // like is what keeps a converged reconcile free of writes.
    let encode = |s: &str| STANDARD.encode(s);
    Child::new::<Secret>(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(db, names, &name, "credentials", inputs.version)?,
        "type": "Opaque",
        "data": {
            "username": encode(user),
            "password": encode(inputs.password),
            "host": encode(&host),
            "port": encode(&port.to_string()),
            "dbname": encode(DATABASE),
            "uri": encode(&uri),
        }
    }))
}

/// The replication role's name (PostgreSQL).
pub const REPLICATION_USER: &str = "streaming_replica";

/// `<name>-replication`: the password replicas stream with (PostgreSQL only). Generated once
/// like the credentials; the primary's agent keeps the role in line with it.
pub fn replication_desired(
    db: &DatabaseCluster,
    names: &Names,
    inputs: &Inputs<'_>,
) -> Result<Option<Child>> {
    if db.spec.engine != Engine::Postgres {
        return Ok(None);
    }
    let name = names.replication_secret();
    let encode = |s: &str| STANDARD.encode(s);
    Ok(Some(Child::new::<Secret>(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(db, names, &name, "replication-credentials", inputs.version)?,
        "type": "Opaque",
        "data": {
            "username": encode(REPLICATION_USER),
            "password": encode(inputs.replication_password),
        }
    }))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_long_random_and_alphanumeric() {
        let a = generate_password();
        let b = generate_password();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
