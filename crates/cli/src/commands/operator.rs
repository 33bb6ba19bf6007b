//! `devctl operator manifests|install|uninstall`.

use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;
use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::web_app::WebApp;
use devctl_operator::manifests::{self, INSTALL_FIELD_MANAGER, InstallOptions, NAME, NAMESPACE};
use devctl_operator::webhook::configuration::{client_config_switch, without_nulls};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::{self, Connection, GlobalArgs};
use crate::wait;

#[derive(Subcommand)]
pub enum OperatorCommand {
    /// Print every object `install` applies, as YAML.
    Manifests {
        /// Operator image.
        #[arg(long, default_value = manifests::DEFAULT_IMAGE)]
        image: String,
        /// Operator replicas.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=5))]
        replicas: i32,
        /// Watch only this namespace, with a Role and RoleBinding there instead of a
        /// cluster-wide grant; repeat or separate with commas for several.
        #[arg(long = "watch-namespace", value_name = "NS", value_delimiter = ',', value_parser = watch_namespace)]
        watch_namespaces: Vec<String>,
    },
    /// Install or upgrade the operator (server-side apply; safe to repeat).
    Install {
        /// Operator image.
        #[arg(long, default_value = manifests::DEFAULT_IMAGE)]
        image: String,
        /// Operator replicas.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..=5))]
        replicas: i32,
        /// Watch only this namespace, with a Role and RoleBinding there instead of a
        /// cluster-wide grant (grants of a previous install that are no longer needed are
        /// deleted); repeat or separate with commas for several.
        #[arg(long = "watch-namespace", value_name = "NS", value_delimiter = ',', value_parser = watch_namespace)]
        watch_namespaces: Vec<String>,
        /// Wait until the operator Deployment is available.
        #[arg(long)]
        wait: bool,
        /// How long to wait: a duration such as `90s`, `5m` or `1h` (a bare number is seconds).
        #[arg(long, default_value = "2m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
    /// Remove the operator, its RBAC (in every watched namespace too) and its CRDs.
    Uninstall {
        /// Delete every DatabaseCluster and WebApp first and wait for their cleanup.
        #[arg(long)]
        delete_resources: bool,
        /// Remove devctl finalizers from remaining resources first (when the operator is gone
        /// and cannot run its cleanup); implies deleting them.
        #[arg(long)]
        skip_finalizers: bool,
        /// How long to wait for resources, the namespace and the CRDs to go away: a duration such
        /// as `90s` or `5m` (a bare number is seconds).
        #[arg(long, default_value = "2m", value_parser = crate::wait::parse_timeout)]
        timeout: Duration,
    },
}

fn watch_namespace(value: &str) -> Result<String, String> {
    manifests::validate_namespace(value).map(|()| value.to_string())
}

pub async fn run(global: &GlobalArgs, command: OperatorCommand) -> anyhow::Result<()> {
    match command {
        OperatorCommand::Manifests {
            image,
            replicas,
            watch_namespaces,
        } => {
            let objects = manifests::manifests(&InstallOptions {
                image,
                replicas,
                watch_namespaces,
            });
            match global.output {
                // Ready for `kubectl apply -f -` either way; a table of manifests would not be.
                crate::output::Format::Table | crate::output::Format::Yaml => {
                    print!("{}", manifests::to_yaml(&objects)?);
                }
                // One document, as kubectl prints several objects: a List.
                crate::output::Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "List",
                        "items": objects,
                    }))?
                ),
            }
            Ok(())
        }
        OperatorCommand::Install {
            image,
            replicas,
            watch_namespaces,
            wait,
            timeout,
        } => {
            install(
                global,
                InstallOptions {
                    image,
                    replicas,
                    watch_namespaces,
                },
                wait,
                timeout,
            )
            .await
        }
        OperatorCommand::Uninstall {
            delete_resources,
            skip_finalizers,
            timeout,
        } => uninstall(global, delete_resources, skip_finalizers, timeout).await,
    }
}

/// The API resource of a manifest object and whether it is namespaced.
fn resource_of(object: &Value) -> anyhow::Result<(ApiResource, bool)> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let (plural, namespaced) = match kind {
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "Namespace" => ("namespaces", false),
        "ServiceAccount" => ("serviceaccounts", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "Deployment" => ("deployments", true),
        "Service" => ("services", true),
        "ValidatingWebhookConfiguration" => ("validatingwebhookconfigurations", false),
        "MutatingWebhookConfiguration" => ("mutatingwebhookconfigurations", false),
        other => anyhow::bail!("no API mapping for manifest kind {other}"),
    };
    Ok((
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural),
        namespaced,
    ))
}

fn dynamic_api(client: &kube::Client, object: &Value) -> anyhow::Result<Api<DynamicObject>> {
    let (resource, namespaced) = resource_of(object)?;
    Ok(if namespaced {
        Api::namespaced_with(
            client.clone(),
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(NAMESPACE),
            &resource,
        )
    } else {
        Api::all_with(client.clone(), &resource)
    })
}

/// `kind name`, plus the namespace when it is not the operator's (the per-namespace grants).
fn describe(object: &Value) -> String {
    let what = format!(
        "{} {}",
        object["kind"].as_str().unwrap_or_default().to_lowercase(),
        object["metadata"]["name"].as_str().unwrap_or_default()
    );
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) if namespace != NAMESPACE => format!("{what} (namespace {namespace})"),
        _ => what,
    }
}

/// The label selector of the operator's per-namespace Roles and RoleBindings (also named
/// [`NAME`], which keeps the leader-election Role out).
fn grant_selector() -> String {
    format!("app.kubernetes.io/name={NAME},app.kubernetes.io/managed-by={INSTALL_FIELD_MANAGER}")
}

/// The operator's Roles and RoleBindings in watched namespaces that are in the cluster now
/// (from an install with `--watch-namespace`), as manifest stubs for [`dynamic_api`].
async fn installed_namespace_grants(connection: &Connection) -> anyhow::Result<Vec<Value>> {
    let params = ListParams::default()
        .labels(&grant_selector())
        .fields(&format!("metadata.name={NAME}"));
    let mut grants = Vec::new();
    for kind in ["RoleBinding", "Role"] {
        let stub = json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": { "name": NAME } });
        let (resource, _) = resource_of(&stub)?;
        let api: Api<DynamicObject> = Api::all_with(connection.client.clone(), &resource);
        let list = api.list(&params).await.map_err(|e| {
            cluster::explain(
                e,
                &format!("listing the operator's {kind}s in watched namespaces"),
                &connection.server,
            )
        })?;
        for object in list.items {
            if let Some(namespace) = object.namespace() {
                let mut stub = stub.clone();
                stub["metadata"]["namespace"] = json!(namespace);
                grants.push(stub);
            }
        }
    }
    Ok(grants)
}

/// Deletes `object`, printing `deleted` or `not found`.
async fn delete_object(connection: &Connection, object: &Value) -> anyhow::Result<()> {
    let api = dynamic_api(&connection.client, object)?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let what = describe(object);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => println!("{what} deleted"),
        Err(kube::Error::Api(status)) if status.code == 404 => println!("{what} not found"),
        Err(e) => {
            return Err(cluster::explain(
                e,
                &format!("deleting {what}"),
                &connection.server,
            ));
        }
    }
    Ok(())
}

/// The webhook configurations, by name (uninstall removes them first: without the operator
/// they would refuse every DatabaseCluster write).
fn webhook_configurations() -> Vec<Value> {
    ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]
        .into_iter()
        .map(|kind| json!({ "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": { "name": NAME } }))
        .collect()
}

/// After an install, deletes the operator grants the installed scope does not use: the
/// cluster-wide ClusterRole and ClusterRoleBinding when watching namespaces, Roles and
/// RoleBindings in namespaces no longer watched. A grant left behind would keep rights the
/// operator no longer needs (a cluster-wide one would defeat `--watch-namespace`).
async fn prune_grants(
    connection: &Connection,
    objects: &[Value],
    watching_namespaces: bool,
) -> anyhow::Result<()> {
    let is_desired = |stale: &Value| {
        objects.iter().any(|o| {
            o["kind"] == stale["kind"]
                && o["metadata"]["name"] == stale["metadata"]["name"]
                && o["metadata"]["namespace"] == stale["metadata"]["namespace"]
        })
    };
    let mut stale: Vec<Value> = installed_namespace_grants(connection)
        .await?
        .into_iter()
        .filter(|g| !is_desired(g))
        .collect();
    if watching_namespaces {
        for kind in ["ClusterRoleBinding", "ClusterRole"] {
            stale.push(json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": { "name": NAME } }));
            stale.push(json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": { "name": manifests::WEBHOOK_NAME } }));
        }
        // A namespace-scoped operator serves no webhooks: configurations left from a
        // cluster-wide install would refuse every DatabaseCluster write.
        stale.extend(webhook_configurations());
        stale.push(json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": manifests::WEBHOOK_NAME, "namespace": manifests::NAMESPACE } }));
        for kind in ["RoleBinding", "Role"] {
            stale.push(json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": { "name": manifests::WEBHOOK_NAME, "namespace": manifests::NAMESPACE } }));
        }
    }
    for object in &stale {
        let api = dynamic_api(&connection.client, object)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let what = describe(object);
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => println!("{what} deleted (not needed by this install)"),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                return Err(cluster::explain(
                    e,
                    &format!("deleting {what}, which this install no longer needs"),
                    &connection.server,
                ));
            }
        }
    }
    Ok(())
}

/// Fails (before anything is applied) when a watched namespace does not exist: install does
/// not create namespaces it does not own.
async fn check_watched_namespaces(
    connection: &Connection,
    options: &InstallOptions,
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(connection.client.clone());
    for namespace in options.watched() {
        if namespace == NAMESPACE {
            continue;
        }
        let found = namespaces.get_opt(&namespace).await.map_err(|e| {
            cluster::explain(
                e,
                &format!("reading watched namespace {namespace}"),
                &connection.server,
            )
        })?;
        if found.is_none() {
            anyhow::bail!(
                "watched namespace {namespace} does not exist; create it first (install grants the operator rights in it, it does not create it)"
            );
        }
    }
    Ok(())
}

/// Applies `objects` with server-side apply, printing created/configured/unchanged like
/// `kubectl apply`.
pub async fn apply_all(connection: &Connection, objects: &[Value]) -> anyhow::Result<()> {
    let params = PatchParams::apply(INSTALL_FIELD_MANAGER).force();
    for object in objects {
        let api = dynamic_api(&connection.client, object)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let what = describe(object);
        let before = api
            .get_opt(name)
            .await
            .map_err(|e| cluster::explain(e, &format!("reading {what}"), &connection.server))?;
        // An operator that ran with --webhook-url (`devctl dev up`) left URLs in the webhook
        // configurations and the CRD's conversion: a server-side apply of the Service would
        // add to them (a client configuration holds exactly one), so they are replaced first.
        if let Some(live) = &before
            && let Some(replace) = client_config_switch(&serde_json::to_value(live)?, object)
        {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&replace))
                .await
                .map_err(|e| {
                    cluster::explain(
                        e,
                        &format!("replacing the webhook client configuration of {what}"),
                        &connection.server,
                    )
                })?;
        }
        let after = api
            .patch(name, &params, &Patch::Apply(without_nulls(object)))
            .await
            .map_err(|e| cluster::explain(e, &format!("applying {what}"), &connection.server))?;
        let verb = match before {
            None => "created",
            Some(before) if applied_content(&before) == applied_content(&after) => "unchanged",
            Some(_) => "configured",
        };
        println!("{what} {verb}");
    }
    Ok(())
}

/// What an apply can change: the object without its status and the server's bookkeeping. A
/// controller's status update between the read and the apply (a Deployment rolling out) bumps
/// the resourceVersion, and is not a change this apply made.
fn applied_content(object: &kube::api::DynamicObject) -> Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("status");
    }
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("resourceVersion");
        metadata.remove("managedFields");
    }
    value
}

async fn install(
    global: &GlobalArgs,
    options: InstallOptions,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let connection = cluster::connect(global).await?;
    check_watched_namespaces(&connection, &options).await?;
    let objects = manifests::manifests(&options);
    let (crds, rest): (Vec<Value>, Vec<Value>) = objects
        .into_iter()
        .partition(|o| o["kind"] == "CustomResourceDefinition");
    apply_all(&connection, &crds).await?;
    let crd_api: Api<CustomResourceDefinition> = Api::all(connection.client.clone());
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        wait::until(
            &crd_api,
            name,
            timeout,
            |c| {
                format!(
                    "CRD {name}: {}",
                    if established(c) {
                        "Established"
                    } else {
                        "waiting to be Established"
                    }
                )
            },
            established,
        )
        .await?;
    }
    apply_all(&connection, &rest).await?;
    let watched = options.watched();
    prune_grants(&connection, &rest, !watched.is_empty()).await?;
    if wait {
        eprintln!("Waiting for the operator Deployment to be available...");
        let deployments: Api<Deployment> = Api::namespaced(connection.client.clone(), NAMESPACE);
        wait::until(
            &deployments,
            NAME,
            timeout,
            deployment_progress,
            deployment_available,
        )
        .await?;
    }
    if watched.is_empty() {
        println!("devctl operator installed in namespace {NAMESPACE}, watching every namespace");
    } else {
        println!(
            "devctl operator installed in namespace {NAMESPACE}, watching {}",
            watched.join(", ")
        );
    }
    Ok(())
}

fn established(crd: Option<&CustomResourceDefinition>) -> bool {
    crd.and_then(|c| c.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

fn deployment_progress(d: Option<&Deployment>) -> String {
    let Some(d) = d else {
        return "deployment not found yet".into();
    };
    let want = d.spec.replicas.unwrap_or(1);
    let status = d.status.as_ref();
    format!(
        "operator: {}/{want} available, {}/{want} up to date",
        status.and_then(|s| s.available_replicas).unwrap_or(0),
        status.and_then(|s| s.updated_replicas).unwrap_or(0)
    )
}

fn deployment_available(d: Option<&Deployment>) -> bool {
    let Some(d) = d else { return false };
    let want = d.spec.replicas.unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation >= d.metadata.generation
            && s.updated_replicas.unwrap_or(0) == want
            && s.available_replicas.unwrap_or(0) == want
    })
}

/// A devctl custom resource still in the cluster.
struct Remaining {
    kind: &'static str,
    namespace: String,
    name: String,
    finalizers: Vec<String>,
}

async fn list_remaining(connection: &Connection) -> anyhow::Result<Vec<Remaining>> {
    async fn list<K>(connection: &Connection, kind: &'static str) -> anyhow::Result<Vec<Remaining>>
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(connection.client.clone());
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(list
                .items
                .iter()
                .map(|o| Remaining {
                    kind,
                    namespace: o.namespace().unwrap_or_default(),
                    name: o.name_any(),
                    finalizers: o.finalizers().to_vec(),
                })
                .collect()),
            // The CRD is not installed: nothing of this kind can exist.
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
            Err(e) => Err(cluster::explain(
                e,
                &format!("listing {kind}s"),
                &connection.server,
            )),
        }
    }
    let mut remaining = list::<DatabaseCluster>(connection, "databasecluster").await?;
    remaining.extend(list::<WebApp>(connection, "webapp").await?);
    Ok(remaining)
}

fn dynamic_for(connection: &Connection, r: &Remaining) -> Api<DynamicObject> {
    let resource = match r.kind {
        "databasecluster" => ApiResource::erase::<DatabaseCluster>(&()),
        _ => ApiResource::erase::<WebApp>(&()),
    };
    Api::namespaced_with(connection.client.clone(), &r.namespace, &resource)
}

async fn uninstall(
    global: &GlobalArgs,
    delete_resources: bool,
    skip_finalizers: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let connection = cluster::connect(global).await?;
    let remaining = list_remaining(&connection).await?;
    if !remaining.is_empty() && !delete_resources && !skip_finalizers {
        let list: Vec<String> = remaining
            .iter()
            .map(|r| format!("{} {}/{}", r.kind, r.namespace, r.name))
            .collect();
        anyhow::bail!(
            "refusing to uninstall: {} devctl resource(s) still exist ({}); delete them, or pass --delete-resources (or --skip-finalizers if the operator is gone)",
            remaining.len(),
            list.join(", ")
        );
    }
    // The webhooks first: once the operator is going, they could only refuse writes.
    for object in webhook_configurations() {
        delete_object(&connection, &object).await?;
    }
    if skip_finalizers {
        for r in &remaining {
            let ours: Vec<&String> = r
                .finalizers
                .iter()
                .filter(|f| f.contains("devctl.io"))
                .collect();
            if ours.is_empty() {
                continue;
            }
            let keep: Vec<&String> = r
                .finalizers
                .iter()
                .filter(|f| !f.contains("devctl.io"))
                .collect();
            let patch = json!({ "metadata": { "finalizers": keep } });
            dynamic_for(&connection, r)
                .patch(&r.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| {
                    cluster::explain(
                        e,
                        &format!(
                            "removing finalizers of {} {}/{}",
                            r.kind, r.namespace, r.name
                        ),
                        &connection.server,
                    )
                })?;
            let names: Vec<&str> = ours.iter().map(|s| s.as_str()).collect();
            println!(
                "{} {}/{}: removed finalizer {}; its cleanup was skipped",
                r.kind,
                r.namespace,
                r.name,
                names.join(", ")
            );
        }
    }
    for r in &remaining {
        match dynamic_for(&connection, r)
            .delete(&r.name, &DeleteParams::background())
            .await
        {
            Ok(_) => println!("{} {}/{} deleted", r.kind, r.namespace, r.name),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                return Err(cluster::explain(
                    e,
                    &format!("deleting {} {}/{}", r.kind, r.namespace, r.name),
                    &connection.server,
                ));
            }
        }
    }
    if !remaining.is_empty() {
        eprintln!(
            "Waiting for {} resource(s) to finish their cleanup...",
            remaining.len()
        );
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = usize::MAX;
        loop {
            let left = list_remaining(&connection).await?;
            if left.is_empty() {
                break;
            }
            if left.len() != last {
                eprintln!(
                    "  {} left: {}",
                    left.len(),
                    left.iter()
                        .map(|r| format!("{}/{}", r.namespace, r.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                last = left.len();
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "timed out after {}s waiting for {} resource(s) to be deleted; is the operator running? If it is gone, run uninstall with --skip-finalizers",
                    timeout.as_secs(),
                    left.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    // The operator first (so it stops acting), RBAC, the namespace, the CRDs last. The
    // default manifests name every cluster-wide and devctl-system object of either scope; the
    // Roles and RoleBindings of watched namespaces are found by label.
    let objects = manifests::manifests(&InstallOptions::default());
    let grants = installed_namespace_grants(&connection).await?;
    let mut ordered: Vec<&Value> = objects
        .iter()
        .filter(|o| o["kind"] != "CustomResourceDefinition")
        .rev()
        .collect();
    let after_deployment = ordered
        .iter()
        .position(|o| o["kind"] == "Deployment")
        .map_or(0, |i| i + 1);
    ordered.splice(after_deployment..after_deployment, grants.iter());
    ordered.extend(
        objects
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition"),
    );
    for object in ordered {
        delete_object(&connection, object).await?;
        if matches!(
            object["kind"].as_str(),
            Some("Namespace" | "CustomResourceDefinition")
        ) {
            let api = dynamic_api(&connection.client, object)?;
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            wait_deleted(&api, name, &describe(object), timeout).await?;
        }
    }
    println!("devctl operator uninstalled");
    Ok(())
}

async fn wait_deleted(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    wait::until_deleted(api, name, timeout)
        .await
        .with_context(|| format!("waiting for {what} to be deleted"))
}
