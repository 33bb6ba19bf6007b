//! Backups in the CLI's data-path tests: the store's Secrets, a spec that backs up to it,
//! `devctl db backup --wait` and `devctl db restore --wait` as a user runs them.

use devctl_api::database_backup::DatabaseBackup;
use devctl_testenv::s3::S3Server;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::databases::Env;

pub const BACKUP_TIMEOUT: &str = "300";

/// The store's credentials and CA as Secrets in the test's namespace.
pub async fn store_secrets(env: &Env, s3: &S3Server) {
    let secrets = env.api::<Secret>();
    let credentials: Secret = serde_json::from_value(json!({
        "metadata": { "name": "s3-credentials" },
        "stringData": {
            "accessKeyId": s3.access_key_id(),
            "secretAccessKey": s3.secret_access_key(),
        }
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &credentials)
        .await
        .unwrap();
    let ca: Secret = serde_json::from_value(json!({
        "metadata": { "name": "s3-ca" },
        "stringData": { "ca.crt": s3.ca_pem() }
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &ca).await.unwrap();
}

pub fn spec(engine: &str, version: &str, replicas: i32, s3: &S3Server) -> serde_json::Value {
    json!({
        "engine": engine, "version": version, "replicas": replicas,
        "storage": { "size": "1Gi" },
        "backup": {
            "enabled": true,
            "destination": {
                "endpoint": s3.endpoint(),
                "bucket": s3.bucket(),
                "path": "devctl",
                "credentialsSecret": "s3-credentials",
                "caSecret": "s3-ca",
            },
        },
    })
}

/// `devctl db backup NAME --wait`: the DatabaseBackup it created.
pub async fn backup_ok(env: &Env, name: &str) -> DatabaseBackup {
    let kubeconfig = env.kubeconfig.clone();
    let name_owned = name.to_string();
    let out = tokio::task::spawn_blocking(move || {
        super::devctl(
            &kubeconfig,
            &[
                "db",
                "backup",
                &name_owned,
                "--wait",
                "--timeout",
                BACKUP_TIMEOUT,
            ],
        )
    })
    .await
    .unwrap();
    let logs = env.agent_log(&format!("{name}-1"));
    assert!(
        out.status.success(),
        "devctl db backup {name} failed:\n{}{}\nagent log:\n{logs}",
        super::stdout(&out),
        super::stderr(&out)
    );
    newest_backup(env, name).await
}

pub async fn newest_backup(env: &Env, cluster: &str) -> DatabaseBackup {
    let mut backups: Vec<DatabaseBackup> = env
        .api::<DatabaseBackup>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|b| b.spec.cluster.name == cluster)
        .collect();
    backups.sort_by_key(|b| b.metadata.creation_timestamp.clone());
    backups.pop().expect("a DatabaseBackup")
}

pub async fn restore_ok(env: &Env, name: &str, from: &str, to: Option<&str>) {
    let kubeconfig = env.kubeconfig.clone();
    let mut args: Vec<String> = [
        "db",
        "restore",
        name,
        "--from",
        from,
        "--wait",
        "--timeout",
        "400",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(to) = to {
        args.extend(["--to".to_string(), to.to_string()]);
    }
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::devctl(&kubeconfig, &args)
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "devctl db restore {name} --from {from} failed:\n{}{}\nagent log:\n{}",
        super::stdout(&out),
        super::stderr(&out),
        env.agent_log(&format!("{name}-0"))
    );
}
