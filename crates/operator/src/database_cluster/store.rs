//! A backup store as the operator uses it: the location with its keys ([`Store`]), an
//! object_store client for it, and finding a backup by its id for a restore. Below both the
//! destination resolution ([`super::backup`]) and retention ([`super::backup_lifecycle`]).

use std::sync::Arc;
use std::time::Duration;

use devctl_api::instance::StoreLocation;
use futures::StreamExt;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as StorePath;

/// A store location with the credentials to use it.
#[derive(Clone, PartialEq, Eq)]
pub struct Store {
    pub location: StoreLocation,
    pub access_key_id: String,
    pub secret_access_key: String,
    pub ca: Option<String>,
}

impl std::fmt::Debug for Store {
    // Never the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// A client for `store` (ring TLS, the store's CA when given).
pub(super) fn client(store: &Store) -> Result<Arc<dyn ObjectStore>, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut options = object_store::ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(10))
        .with_timeout(Duration::from_secs(60));
    if let Some(ca) = &store.ca {
        let certificate = object_store::Certificate::from_pem(ca.as_bytes())
            .map_err(|_| "the store's ca.crt is not a PEM certificate".to_string())?;
        options = options.with_root_certificate(certificate);
    }
    let s3 = AmazonS3Builder::new()
        .with_endpoint(&store.location.endpoint)
        .with_bucket_name(&store.location.bucket)
        .with_region(&store.location.region)
        .with_access_key_id(&store.access_key_id)
        .with_secret_access_key(&store.secret_access_key)
        .with_virtual_hosted_style_request(false)
        .with_client_options(options)
        .build()
        .map_err(|e| format!("store client: {e}"))?;
    Ok(Arc::new(s3))
}

/// `text` without the store's keys (object_store errors may quote the S3 response, which
/// names the access key).
pub(super) fn scrub(text: String, store: &Store) -> String {
    let mut text = text;
    for secret in [&store.access_key_id, &store.secret_access_key] {
        if !secret.is_empty() {
            text = text.replace(secret.as_str(), "<redacted>");
        }
    }
    text.replace('\n', " ")
}

/// The store prefix (`<path>/<namespace>/<cluster>/<systemIdentifier>/`, ending in `/`) of
/// the backup a `recovery.source` names by its id, found by listing the store under what the
/// source gives; only complete backups (with their manifest) count. `store` is the source's
/// store at its root.
pub async fn locate_backup(
    store: &Store,
    source: &devctl_api::database_cluster::RecoverySource,
) -> Result<String, String> {
    let given = [
        source.namespace.as_deref(),
        source.cluster.as_deref(),
        source.system_identifier.as_deref(),
    ];
    let root = source.destination.path.trim_matches('/');
    // As deep as the given fields go without a gap.
    let search: Vec<&str> = std::iter::once(root)
        .filter(|r| !r.is_empty())
        .chain(given.iter().map_while(|g| *g))
        .collect();
    let search = search.join("/");
    let s3 = client(store).map_err(|why| scrub(why, store))?;
    let path = (!search.is_empty()).then(|| StorePath::from(search.as_str()));
    let mut listing = s3.list(path.as_ref());
    let mut found = std::collections::BTreeSet::new();
    while let Some(entry) = listing.next().await {
        let entry = entry.map_err(|e| scrub(format!("listing the store: {e}"), store))?;
        let key = entry.location.to_string();
        if let Some(prefix) = manifest_prefix(&key, root, &source.backup_id, given) {
            found.insert(prefix.to_string());
        }
    }
    let where_ = if search.is_empty() {
        format!("bucket {}", store.location.bucket)
    } else {
        format!("{}/{search}/", store.location.bucket)
    };
    match found.len() {
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        0 => Err(format!(
            "spec.bootstrap.recovery.source: no complete backup {} under {where_}",
            source.backup_id
        )),
        _ => Err(format!(
            "spec.bootstrap.recovery.source: backup {} is under several clusters ({}): set namespace, cluster and systemIdentifier",
            source.backup_id,
            found.into_iter().collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The cluster prefix of `key` when it is the manifest of backup `backup_id` in the store's
/// layout under `root` (`<root>/<namespace>/<cluster>/<systemIdentifier>/base/<id>/backup.json`)
/// and agrees with every `given` part of the layout (pure).
fn manifest_prefix<'k>(
    key: &'k str,
    root: &str,
    backup_id: &str,
    given: [Option<&str>; 3],
) -> Option<&'k str> {
    let prefix = key.strip_suffix(&format!("base/{backup_id}/backup.json"))?;
    let relative = match root {
        "" => prefix,
        root => prefix.strip_prefix(root)?.strip_prefix('/')?,
    };
    let layout: Vec<&str> = relative.trim_end_matches('/').split('/').collect();
    (layout.len() == 3
        && layout.iter().all(|part| !part.is_empty())
        && given
            .iter()
            .zip(&layout)
            .all(|(given, part)| given.is_none_or(|g| g == *part)))
    .then_some(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_found_by_its_id_where_the_given_parts_of_the_layout_agree() {
        let key = "devctl/prod/db/7301/base/20261130T120000Z-db-1/backup.json";
        let id = "20261130T120000Z-db-1";
        let none = [None, None, None];
        assert_eq!(
            manifest_prefix(key, "devctl", id, none),
            Some("devctl/prod/db/7301/")
        );
        assert_eq!(
            manifest_prefix(key, "devctl", id, [Some("prod"), Some("db"), None]),
            Some("devctl/prod/db/7301/")
        );
        assert_eq!(
            manifest_prefix(key, "devctl", id, [Some("dev"), None, None]),
            None
        );
        assert_eq!(manifest_prefix(key, "devctl", "other", none), None);
        // Another root, or not the layout's depth.
        assert_eq!(manifest_prefix(key, "devct", id, none), None);
        assert_eq!(manifest_prefix(key, "", id, none), None);
        assert_eq!(
            manifest_prefix(&key["devctl/".len()..], "", id, none),
            Some("prod/db/7301/")
        );
        // A file of the backup that is not its manifest: an incomplete backup is not found.
        let data = "devctl/prod/db/7301/base/20261130T120000Z-db-1/base.tar";
        assert_eq!(manifest_prefix(data, "devctl", id, none), None);
    }
}
