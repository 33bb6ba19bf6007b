//! The Grafana dashboard and the PrometheusRule in deploy/monitoring/ against the operator
//! that exports their metrics: every PromQL expression parses, every alert is documented, and
//! every metric they name is exported by the operator binary once a DatabaseCluster has
//! reached Ready and its status holds the data behind each per-cluster series. A metric
//! renamed (or misspelt) on either side fails here, not silently on a dashboard.

mod support;

use std::collections::BTreeSet;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::STATUS_ANNOTATION;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use promql_parser::parser::{self, Expr};
use serde_json::{Value, json};
use support::{OperatorProcess, TIMEOUT, is_ready};

const DASHBOARD: &str = include_str!("../../../deploy/monitoring/devctl-dashboard.json");
const ALERTS: &str = include_str!("../../../deploy/monitoring/devctl-alerts.yaml");
const RUNBOOK: &str = include_str!("../../../docs/monitoring.md");

/// Series Prometheus records itself for every target, which no exporter serves.
const PROMETHEUS_OWN: &[&str] = &["up"];

/// The job the alerts select (the metrics Service's name, docs/monitoring.md).
const JOB: &str = r#"job="devctl-operator-metrics""#;

/// One PromQL expression and where it comes from, for messages.
struct Query {
    origin: String,
    expr: String,
}

/// Grafana's variables as the dashboard uses them, replaced by what Prometheus would get.
/// Anything else starting with `$` is left in and fails to parse, so a new variable must be
/// added here deliberately.
fn substitute_grafana_variables(expr: &str) -> String {
    [
        ("$__rate_interval", "5m"),
        ("$__interval", "1m"),
        ("$__range", "6h"),
        ("$job", "devctl-operator-metrics"),
        ("$namespace", ".*"),
    ]
    .iter()
    .fold(expr.to_string(), |e, (var, value)| e.replace(var, value))
}

/// Every `expr` of the dashboard's panels and the selector inside each `label_values(...)`
/// variable query.
fn dashboard_queries() -> Vec<Query> {
    fn walk(value: &Value, path: &str, out: &mut Vec<Query>) {
        match value {
            Value::Object(map) => {
                let title = map.get("title").and_then(Value::as_str).unwrap_or_default();
                let here = if title.is_empty() {
                    path.to_string()
                } else {
                    format!("{path} / {title}")
                };
                for (key, v) in map {
                    if key == "expr"
                        && let Some(expr) = v.as_str()
                    {
                        out.push(Query {
                            origin: format!("dashboard{here}"),
                            expr: expr.to_string(),
                        });
                    } else {
                        walk(v, &here, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, path, out)),
            _ => {}
        }
    }
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    walk(&dashboard["panels"], "", &mut queries);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(query) = variable["query"]["query"].as_str() else {
            continue;
        };
        let selector = query
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map(|(selector, _)| selector.to_string())
            .unwrap_or_else(|| {
                panic!("variable query {query:?}: only label_values(selector, label) is checked")
            });
        queries.push(Query {
            origin: format!("dashboard variable {}", variable["name"]),
            expr: selector,
        });
    }
    queries
}

/// The alerting rules of the PrometheusRule.
fn alert_rules() -> Vec<Value> {
    let rule: Value = serde_saphyr::from_str(ALERTS).expect("the PrometheusRule is YAML");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn alert_queries() -> Vec<Query> {
    alert_rules()
        .iter()
        .map(|r| Query {
            origin: format!("alert {}", r["alert"]),
            expr: r["expr"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

fn all_queries() -> Vec<Query> {
    let mut queries = dashboard_queries();
    queries.extend(alert_queries());
    queries
}

/// The metric names an expression selects (from the AST: vector and matrix selectors,
/// including a `{__name__="..."}` matcher).
fn metric_names(expr: &Expr, out: &mut BTreeSet<String>) {
    let selector = |vs: &parser::VectorSelector, out: &mut BTreeSet<String>| {
        out.extend(vs.name.clone());
        out.extend(
            vs.matchers
                .matchers
                .iter()
                .filter(|m| m.name == "__name__")
                .map(|m| m.value.clone()),
        );
    };
    match expr {
        Expr::VectorSelector(vs) => selector(vs, out),
        Expr::MatrixSelector(ms) => selector(&ms.vs, out),
        Expr::Aggregate(a) => {
            metric_names(&a.expr, out);
            if let Some(param) = &a.param {
                metric_names(param, out);
            }
        }
        Expr::Unary(u) => metric_names(&u.expr, out),
        Expr::Binary(b) => {
            metric_names(&b.lhs, out);
            metric_names(&b.rhs, out);
        }
        Expr::Paren(p) => metric_names(&p.expr, out),
        Expr::Subquery(s) => metric_names(&s.expr, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| metric_names(a, out)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// Every metric name the dashboard and the alerts use, parsed; panics with every expression
/// that does not parse.
fn referenced_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    for query in all_queries() {
        let expr = substitute_grafana_variables(&query.expr);
        match parser::parse(&expr) {
            Ok(ast) => {
                let mut own = BTreeSet::new();
                metric_names(&ast, &mut own);
                if own.is_empty() {
                    failures.push(format!("{}: selects no metric: {expr}", query.origin));
                }
                names.extend(own);
            }
            Err(error) => failures.push(format!("{}: {error}\n  {expr}", query.origin)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    names
}

/// The sample names in a text exposition: `x_total` of a counter, `x_bucket`/`x_sum`/`x_count`
/// of a histogram, so a query must use the suffix the metric's type really has.
fn exported_samples(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Referenced names that `exported` lacks (Prometheus's own series aside).
fn missing(referenced: &BTreeSet<String>, exported: &BTreeSet<String>) -> Vec<String> {
    referenced
        .iter()
        .filter(|n| !exported.contains(*n) && !PROMETHEUS_OWN.contains(&n.as_str()))
        .cloned()
        .collect()
}

#[test]
fn every_query_parses_and_selects_a_metric() {
    let names = referenced_metrics();
    // The panels the dashboard promises, by the metrics behind them.
    for name in [
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "devctl_clusters",
        "devctl_cluster_replication_lag_bytes",
        "devctl_cluster_last_backup_timestamp_seconds",
        "devctl_cluster_failovers_total",
    ] {
        assert!(names.contains(name), "nothing uses {name}: {names:?}");
    }
}

#[test]
fn a_misspelt_metric_is_reported_missing() {
    // The check below is only worth something if a typo trips it.
    let exposition = "# TYPE controller_runtime_reconcile counter\ncontroller_runtime_reconcile_total{controller=\"x\",result=\"success\"} 1\n# EOF\n";
    let mut names = BTreeSet::new();
    let ast =
        parser::parse("sum(rate(controller_runtime_reconcile_totl[5m])) + up").expect("parses");
    metric_names(&ast, &mut names);
    assert_eq!(
        missing(&names, &exported_samples(exposition)),
        vec!["controller_runtime_reconcile_totl".to_string()]
    );
    // A counter is queried with its `_total` suffix, as Prometheus stores it.
    let bare: BTreeSet<String> = ["controller_runtime_reconcile".to_string()].into();
    assert_eq!(missing(&bare, &exported_samples(exposition)).len(), 1);
}

#[test]
fn every_alert_is_labelled_documented_and_selects_the_job() {
    let rules = alert_rules();
    assert!(rules.len() >= 6, "{rules:?}");
    // GitHub's heading anchors: lower case, spaces to dashes, other punctuation dropped.
    let anchors: BTreeSet<String> = RUNBOOK
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    for rule in &rules {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name}: no {annotation}"
            );
        }
        let runbook = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let anchor = runbook
            .strip_prefix("docs/monitoring.md#")
            .unwrap_or_else(|| {
                panic!("{name}: runbook_url {runbook:?} is not a docs/monitoring.md section")
            });
        assert_eq!(anchor, name.to_lowercase(), "{name}: runbook anchor");
        assert!(
            anchors.contains(anchor),
            "{name}: docs/monitoring.md has no section #{anchor} ({anchors:?})"
        );
        // Every selector is scoped to the operator's job, or another exporter's series of the
        // same name (up!) would count.
        let expr = rule["expr"].as_str().unwrap_or_default();
        let selectors = expr.matches('{').count();
        assert_eq!(
            expr.matches(JOB).count(),
            selectors,
            "{name}: every selector needs {JOB}: {expr}"
        );
    }
}

/// Grants the operator process's user its leader-election Role in `namespace`, as the install
/// does in the operator's own namespace.
async fn grant_leader_election(cluster: &devctl_testenv::Cluster, namespace: &str) {
    let user = format!("devctl-operator-{namespace}");
    let client = cluster.client().await.unwrap();
    let api = |kind: &str, plural: &str| {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
            plural,
        );
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
    };
    let objects = [
        (
            "Role",
            "roles",
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": { "name": user },
                "rules": devctl_operator::manifests::leader_election_policy_rules() }),
        ),
        (
            "RoleBinding",
            "rolebindings",
            json!({ "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": { "name": user },
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user },
                "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }] }),
        ),
    ];
    for (kind, plural, body) in objects {
        api(kind, plural)
            .patch(
                &user,
                &PatchParams::apply("devctl-test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }
}

/// Merges `fields` into the instance report on `pod`, as its agent would report them.
async fn report(pods: &Api<Pod>, pod: &str, fields: Value) {
    let current = pods.get(pod).await.unwrap();
    let mut status: Value = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATUS_ANNOTATION))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_else(|| panic!("{pod} has no instance report"));
    for (key, value) in fields.as_object().into_iter().flatten() {
        status[key] = value.clone();
    }
    let patch = json!({ "metadata": { "annotations": { STATUS_ANNOTATION: status.to_string() } } });
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_use_is_exported() {
    let referenced = referenced_metrics();
    let cluster = devctl_testenv::shared_cluster().await.unwrap();
    cluster.install_crds(&devctl_api::crds()).await.unwrap();
    let namespace = cluster.create_namespace("monitoring").await.unwrap();
    grant_leader_election(cluster, &namespace).await;
    // The binary as deployed (with leader election, so the leader series exists), serving
    // /metrics through `metrics::serve`.
    let operator = OperatorProcess::start(
        cluster,
        &namespace,
        devctl_operator::manifests::RULES,
        &["--leader-elect", "--leader-election-namespace", &namespace],
    )
    .await;
    operator.wait_ready().await;

    let client = cluster.client().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    // Scheduled backups need a destination to be on; nothing contacts it before the first
    // scheduled run (02:00), and the backup below is reported, not taken.
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "store" },
                "stringData": { "accessKeyId": "test", "secretAccessKey": "test" },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let dbs: Api<DatabaseCluster> = Api::namespaced(client.clone(), &namespace);
    let db: DatabaseCluster = serde_json::from_value(json!({
        "apiVersion": "db.devctl.io/v1beta1", "kind": "DatabaseCluster",
        "metadata": { "name": "db" },
        "spec": {
            "engine": "postgres", "version": "16.2", "replicas": 2, "storage": { "size": "1Gi" },
            "backup": { "schedule": "0 2 * * *", "destination": {
                "endpoint": "https://127.0.0.1:9", "bucket": "devctl-backups",
                "region": "us-east-1", "credentialsSecret": "store" } },
        },
    }))
    .unwrap();
    dbs.create(&PostParams::default(), &db).await.unwrap();
    devctl_testenv::eventually("db Ready with 2 instances", TIMEOUT, || async {
        dbs.get_opt("db")
            .await
            .ok()
            .flatten()
            .filter(|db| is_ready(db, 2))
    })
    .await
    .unwrap();

    // A failover cannot happen without agents holding the primary lock (process-backed pods,
    // crates/cli/tests/failover.rs); the status one leaves behind is what the metrics read,
    // and the operator carries `failoverEpoch` and `lastFailoverTime` forward.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    dbs.patch_status(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "failoverEpoch": 1, "lastFailoverTime": now } })),
    )
    .await
    .unwrap();

    // What the simulated agents do not report by themselves: a replica's lag and a completed
    // backup (the agents' reports are where the operator learns both).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    report(
        &pods,
        "db-1",
        json!({ "lagBytes": 4096, "lagSeconds": 3, "restarts": 2, "lastRestartTime": now,
                "lastExit": "postgres exited (signal: 9 (SIGKILL))" }),
    )
    .await;
    report(
        &pods,
        "db-0",
        json!({ "backup": { "name": "db-manual", "uid": "u", "backupId": "b", "phase": "Completed",
                            "startedAt": now, "stoppedAt": now } }),
    )
    .await;
    // A status change alone does not trigger a reconcile (the watch predicate passes spec and
    // annotation changes); this one comes after the status in the watch, so it reads it.
    dbs.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { "test.devctl.io/poke": "1" } } })),
    )
    .await
    .unwrap();

    let want = [
        r#"devctl_cluster_replication_lag_bytes{namespace="NS",cluster="db",pod="db-1"} 4096"#,
        r#"devctl_cluster_engine_restarts{namespace="NS",cluster="db",pod="db-1"} 2"#,
        r#"devctl_cluster_failovers_total{namespace="NS",cluster="db"} 1"#,
        r#"devctl_clusters{namespace="NS",phase="Running"} 1"#,
        r#"devctl_cluster_ready_replicas{namespace="NS",cluster="db"} 2"#,
    ]
    .map(|line| line.replace("NS", &namespace));
    let exported = devctl_testenv::eventually(
        "every referenced metric exported, with the scenario's values",
        TIMEOUT,
        || async {
            let text = operator.http_get("/metrics")?;
            (missing(&referenced, &exported_samples(&text)).is_empty()
                && want.iter().all(|line| text.contains(line.as_str())))
            .then_some(text)
        },
    )
    .await;
    let exposition = match exported {
        Ok(text) => text,
        Err(error) => {
            let text = operator.http_get("/metrics").unwrap_or_default();
            let status = dbs
                .get_opt("db")
                .await
                .ok()
                .flatten()
                .and_then(|d| d.status);
            panic!(
                "{error}\nmissing: {:?}\nexpected lines: {want:#?}\nmetrics:\n{text}\nstatus: {status:#?}",
                missing(&referenced, &exported_samples(&text)),
            )
        }
    };
    assert!(
        exposition.contains(&format!(
            r#"devctl_cluster_backup_schedule_interval_seconds{{namespace="{namespace}",cluster="db"}} 86400.0"#
        )),
        "{exposition}"
    );

    // Deleted clusters leave nothing behind.
    dbs.delete("db", &Default::default()).await.unwrap();
    let cluster_label = r#"cluster="db""#;
    devctl_testenv::eventually("the deleted cluster's series gone", TIMEOUT, || async {
        let text = operator.http_get("/metrics")?;
        (!text.contains(cluster_label) && !text.contains(&format!(r#"namespace="{namespace}""#)))
            .then_some(())
    })
    .await
    .unwrap_or_else(|error| {
        panic!(
            "{error}\n{}",
            operator.http_get("/metrics").unwrap_or_default()
        )
    });
}
