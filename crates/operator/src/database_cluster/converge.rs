//! Act: applies the cluster's children ([`super::resources::desired`], rendered for the
//! plan's version) and deletes orphans. The one write that reads as it goes: the
//! credentials Secrets' passwords are read from the API (the cache keeps no Secret data) only
//! when a Secret may have to be written.

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::{BACKUP_STORE_SECRET_SUFFIX, RESTORE_STORE_SECRET_SUFFIX};
use k8s_openapi::Resource as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;

use super::backup;
use super::resources::{self, Inputs, Names, secret};
use crate::children::{Change, Orphanage, Owner, orphan_of};
use crate::context::Context;
use crate::error::{Error, Result};

/// What one convergence did.
pub struct Converged {
    pub changes: Vec<Change>,
    /// The credentials Secret was gone while the cluster's data existed: a new password.
    pub credentials_regenerated: bool,
}

/// Applies the children and deletes orphans.
pub async fn converge(
    db: &DatabaseCluster,
    ctx: &Context,
    names: &Names,
    target_version: &str,
    sts: Option<&StatefulSet>,
    store: &backup::Resolved,
) -> Result<Converged> {
    let owner_uid = db.uid().ok_or(Error::MissingField("metadata.uid"))?;
    let existing_claim_size = sts
        .and_then(|s| s.spec.volume_claim_templates.as_ref())
        .and_then(|t| t.first())
        .and_then(|t| t.spec.as_ref())
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone());
    // The backup and restore stores' Secrets do not depend on the passwords: rendered once.
    let mut stores = Vec::new();
    if let Some(destination) = &store.destination {
        stores.push(backup::store_secret(
            db,
            names,
            target_version,
            BACKUP_STORE_SECRET_SUFFIX,
            destination,
        )?);
    }
    if let Some((_, source)) = &store.restore {
        stores.push(backup::store_secret(
            db,
            names,
            target_version,
            RESTORE_STORE_SECRET_SUFFIX,
            source,
        )?);
    }
    let settled = Inputs {
        password: None,
        replication_password: None,
        version: target_version,
        existing_claim_size: existing_claim_size.as_deref(),
        cluster_domain: &ctx.settings.cluster_domain,
        agent_image: &ctx.settings.agent_image,
    };
    let render_key = settled.render_key(db, &stores);
    let owner = Owner {
        namespace: &names.namespace,
        uid: &owner_uid,
    };
    let applier = ctx.caches.applier();
    // Most reconciles (a pod's report, a health check) change no input of the render: when
    // every child is still as the last complete sync left it, rendering them again and
    // comparing would find nothing to do.
    if applier.render_unneeded(&ctx.caches, owner, render_key) {
        return Ok(Converged {
            changes: Vec::new(),
            credentials_regenerated: false,
        });
    }
    applier.forget_render(owner);
    // Passwords are read only when a credentials Secret may have to be written: a Secret as
    // we left it is rendered with placeholders and skipped. If its desired state changed
    // after all (its hash does not depend on the password), read them and render again.
    let mut read = false;
    // A Secret the cache does not know is created, never applied over one of its name; if
    // one exists after all (a Secret without devctl's labels, or ours not yet seen by the
    // watch), both are read and everything is rendered and synced again.
    let (changes, credentials) = loop {
        let (mut desired, credentials) = loop {
            // Regenerated silently: the primary's agent applies it and the replicas read it.
            let replication = credentials(
                ctx,
                names,
                &names.replication_secret(),
                &owner_uid,
                false,
                read,
            )
            .await?;
            let credentials =
                credentials(ctx, names, &names.secret(), &owner_uid, sts.is_some(), read).await?;
            let inputs = Inputs {
                password: credentials.password.as_deref(),
                replication_password: replication.password.as_deref(),
                ..settled
            };
            let mut desired = resources::desired(db, &inputs)?;
            let secrets = ctx.caches.kind(Secret::KIND)?;
            let outdated = desired.iter().any(|child| {
                child.placeholder
                    && secrets
                        .meta(&names.namespace, &child.name)
                        .and_then(|live| live.hash)
                        .as_deref()
                        != Some(child.hash.as_str())
            });
            if outdated && !read {
                read = true;
                continue;
            }
            for read in [&replication, &credentials] {
                let secret = desired
                    .iter_mut()
                    .find(|c| c.kind == Secret::KIND && c.name == read.name);
                if let Some(secret) = secret {
                    secret.live.clone_from(&read.live);
                    secret.create_only = read.create_only;
                }
            }
            break (desired, credentials);
        };
        desired.extend(stores.iter().cloned());
        match applier
            .sync(&ctx.client, &ctx.caches, owner, &desired, resources::KINDS)
            .await
        {
            Err(Error::ChildExists { kind, .. }) if kind == Secret::KIND && !read => read = true,
            synced => {
                let changes = synced?;
                applier.remember_render(owner, render_key, &desired);
                break (changes, credentials);
            }
        }
    };
    Ok(Converged {
        changes,
        credentials_regenerated: credentials.regenerated,
    })
}

struct Credentials {
    /// The Secret's name.
    name: String,
    /// `None` when the Secret is as we left it and was not read.
    password: Option<String>,
    regenerated: bool,
    /// The Secret as read, for the applier's drift check.
    live: Option<serde_json::Value>,
    /// Neither the cache nor our record knows the Secret and it was not read: a new password,
    /// written by creating the Secret ([`crate::children::Child::create_only`]).
    create_only: bool,
}

/// The password of the Secret `secret_name` (credentials or replication): the one it holds,
/// or a new one when it is gone or empty (`regenerated` when the data already existed). A
/// Secret of that name that the cluster does not control is never read or touched. The
/// cache keeps no Secret data, so the password is read from the API — only when `read` is
/// set or the Secret is not as our last apply left it; otherwise it is not needed (`None`).
async fn credentials(
    ctx: &Context,
    names: &Names,
    secret_name: &str,
    owner_uid: &str,
    data_exists: bool,
    read: bool,
) -> Result<Credentials> {
    let owned_by_us = |s: &Secret| {
        s.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.uid == owner_uid)
    };
    let not_owned = || Error::CredentialsSecretNotOwned {
        name: secret_name.to_string(),
    };
    if let Some(cached) = ctx
        .caches
        .kind(Secret::KIND)?
        .meta(&names.namespace, secret_name)
    {
        // Controlled by another object: read below, which tells a deleted cluster's Secret
        // the garbage collector is about to remove from someone else's.
        let ours = cached.controller.as_ref().is_some_and(|c| c.is(owner_uid));
        let as_we_left_it = ours
            && ctx
                .caches
                .applier()
                .unchanged(Secret::KIND, &names.namespace, secret_name, &cached);
        if as_we_left_it && !read {
            return Ok(Credentials {
                name: secret_name.to_string(),
                password: None,
                regenerated: false,
                live: None,
                create_only: false,
            });
        }
    } else if !read
        && !ctx
            .caches
            .applier()
            .wrote(Secret::KIND, &names.namespace, secret_name)
    {
        // Unknown to the cache and not written by us: most likely there is none. Creating it
        // cannot overwrite one there is after all, so it need not be looked up first.
        return Ok(Credentials {
            name: secret_name.to_string(),
            password: Some(secret::generate_password()),
            regenerated: data_exists,
            live: None,
            create_only: true,
        });
    }
    // A Secret without devctl's labels is not in the cache, and a cold or lagging cache must
    // never cause a new password: the API has the last word.
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let live = api
        .get_opt(secret_name)
        .await
        .map_err(|source| Error::Child {
            action: "read",
            kind: "Secret",
            name: secret_name.to_string(),
            source,
        })?;
    let (password, regenerated) = match &live {
        // The Secret of a deleted cluster of this name, not removed yet: a wait.
        Some(live)
            if !owned_by_us(live)
                && (live.metadata.deletion_timestamp.is_some()
                    || live.owner_references().iter().any(|r| {
                        r.controller == Some(true)
                            && r.kind == <DatabaseCluster as kube::Resource>::kind(&())
                            && r.name == names.name
                    })) =>
        {
            return Err(Error::ChildOfDeletedOwner {
                kind: Secret::KIND,
                name: secret_name.to_string(),
                previous: format!("DatabaseCluster {}", names.name),
            });
        }
        Some(live)
            if !owned_by_us(live)
                && orphan_of(&live.metadata, &names.owner_labels()) != Orphanage::Ours =>
        {
            return Err(not_owned());
        }
        // Ours, or left behind for this name by a deletion that kept the children: its
        // password stays (the sync adopts it).
        Some(live) => match secret::existing_password(live) {
            Some(password) => (password, false),
            None => (secret::generate_password(), data_exists),
        },
        None => (secret::generate_password(), data_exists),
    };
    Ok(Credentials {
        name: secret_name.to_string(),
        password: Some(password),
        regenerated,
        live: live.and_then(|l| serde_json::to_value(l).ok()),
        create_only: false,
    })
}
