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

/// Stands in for values derived from a password the reconcile did not read. The hash of a
/// credentials Secret is always computed over the placeholders, so it does not depend on
/// whether the password was read (nor reveals anything about it).
const PLACEHOLDER: &str = "password-not-read";

/// `child` with the real values of `data` put in place of the placeholders the hash was
/// computed over, or marked as a placeholder when the password was not read.
fn fill(mut child: Child, values: Option<Vec<(&str, String)>>) -> Child {
    match values {
        Some(values) => {
            if let Some(data) = child.body.get_mut("data").and_then(|d| d.as_object_mut()) {
                for (key, value) in values {
                    data.insert(key.to_string(), STANDARD.encode(value).into());
                }
            }
        }
        None => child.placeholder = true,
    }
    child
}

pub fn desired(db: &DatabaseCluster, names: &Names, inputs: &Inputs<'_>) -> Result<Child> {
    let name = names.secret();
    let engine = db.spec.engine;
    let user = username(engine);
    let host = names.dns(&names.read_write_service(), inputs.cluster_domain);
    let port = db.spec.port();
    let scheme = match engine {
        Engine::Postgres => "postgresql",
        Engine::Mysql | Engine::Mariadb => "mysql",
    };
    let uri = |password: &str| format!("{scheme}://{user}:{password}@{host}:{port}/{DATABASE}");
    // `data` (base64), not `stringData`: the server stores `data`, and comparing like with
    // like is what keeps a converged reconcile free of writes.
    let encode = |s: &str| STANDARD.encode(s);
    let child = Child::new::<Secret>(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(db, names, &name, "credentials", inputs.version)?,
        "type": "Opaque",
        "data": {
            "username": encode(user),
            "password": encode(PLACEHOLDER),
            "host": encode(&host),
            "port": encode(&port.to_string()),
            "dbname": encode(DATABASE),
            "uri": encode(&uri(PLACEHOLDER)),
        }
    }))?;
    Ok(fill(
        child,
        inputs
            .password
            .map(|p| vec![("password", p.to_string()), ("uri", uri(p))]),
    ))
}

/// The replication role's name (PostgreSQL).
pub const REPLICATION_USER: &str = "streaming_replica";
/// The replication user's name (MariaDB).
pub const MARIADB_REPLICATION_USER: &str = "devctl_replication";

/// `<name>-replication`: the password replicas replicate with (PostgreSQL, MariaDB). Generated
/// once like the credentials; the primary's agent keeps the role in line with it.
pub fn replication_desired(
    db: &DatabaseCluster,
    names: &Names,
    inputs: &Inputs<'_>,
) -> Result<Option<Child>> {
    let user = match db.spec.engine {
        Engine::Postgres => REPLICATION_USER,
        Engine::Mariadb => MARIADB_REPLICATION_USER,
        Engine::Mysql => return Ok(None),
    };
    let name = names.replication_secret();
    let encode = |s: &str| STANDARD.encode(s);
    let child = Child::new::<Secret>(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(db, names, &name, "replication-credentials", inputs.version)?,
        "type": "Opaque",
        "data": {
            "username": encode(user),
            "password": encode(PLACEHOLDER),
        }
    }))?;
    Ok(Some(fill(
        child,
        inputs
            .replication_password
            .map(|p| vec![("password", p.to_string())]),
    )))
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

    #[test]
    fn the_hash_does_not_depend_on_whether_the_password_was_read() {
        let db = crate::database_cluster::resources::test_support::sample();
        let names = Names::of(&db).unwrap();
        let read = crate::database_cluster::resources::test_support::inputs();
        let not_read = Inputs {
            password: None,
            replication_password: None,
            ..read.clone()
        };
        let other = Inputs {
            password: Some("another"),
            ..read.clone()
        };
        let known = desired(&db, &names, &read).unwrap();
        let placeholder = desired(&db, &names, &not_read).unwrap();
        assert_eq!(known.hash, placeholder.hash);
        assert_eq!(known.hash, desired(&db, &names, &other).unwrap().hash);
        assert!(placeholder.placeholder && !known.placeholder);
        let data = &known.body["data"];
        assert_eq!(data["password"], STANDARD.encode("s3cretpassword"));
        let uri =
            String::from_utf8(STANDARD.decode(data["uri"].as_str().unwrap()).unwrap()).unwrap();
        assert!(uri.contains(":s3cretpassword@"), "{uri}");
        let replication = replication_desired(&db, &names, &not_read)
            .unwrap()
            .unwrap();
        assert!(replication.placeholder);
        assert_eq!(
            replication.hash,
            replication_desired(&db, &names, &read)
                .unwrap()
                .unwrap()
                .hash
        );
    }
}
