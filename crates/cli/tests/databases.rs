//! Real databases behind devctl's pods: kwok pods backed by `devctl-agent` processes running
//! Debian's PostgreSQL and MariaDB (`devctl-testenv`'s process runner), the operator
//! in-process, and `devctl` driven as a user drives it.

mod support;

use devctl_api::database_cluster::DatabaseCluster;
use devctl_api::instance::InstanceStatus;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use serde_json::json;
use support::databases::{Env, READY_TIMEOUT, condition, ready};

/// Deletes the one instance's claim and pod of `cluster`, which has been ready: the new pod on
/// an empty volume refuses to bootstrap an empty database in place of the data, and the
/// cluster's `Ready` says why.
async fn a_lost_volume_is_never_reinitialised(env: &Env, cluster: &str) {
    let pod_name = format!("{cluster}-0");
    let claim_name = format!("data-{cluster}-0");
    let claims = env.api::<PersistentVolumeClaim>();
    let old_claim = claims.get(&claim_name).await.unwrap().metadata.uid;
    claims
        .delete(&claim_name, &DeleteParams::default())
        .await
        .unwrap();
    env.api::<Pod>()
        .delete(&pod_name, &DeleteParams::default())
        .await
        .unwrap();
    let refusal = devctl_testenv::eventually(
        &format!("{pod_name} on a new volume to refuse an empty database"),
        READY_TIMEOUT,
        || async {
            let claim = claims.get_opt(&claim_name).await.ok()??;
            let pod = env.api::<Pod>().get_opt(&pod_name).await.ok()??;
            let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
            let error = report
                .last_error
                .filter(|e| e.contains("refusing to initialise"))?;
            (claim.metadata.uid != old_claim && !report.ready).then_some(error)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{pod_name} agent log:\n{}", env.agent_log(&pod_name)));
    assert!(
        refusal.contains(&format!("the data of the primary {pod_name} is gone"))
            && refusal.contains("devctl db restore"),
        "{refusal}"
    );
    devctl_testenv::eventually(
        &format!("{cluster}'s Ready condition to say why it is not ready"),
        READY_TIMEOUT,
        || async {
            let db = env.api::<DatabaseCluster>().get(cluster).await.ok()?;
            let status = db.status?;
            let ready = devctl_api::conditions::find(&status.conditions, "Ready")?;
            (ready.status == "False" && ready.message.contains("refusing to initialise"))
                .then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_and_mariadb_become_ready_when_the_engine_serves_and_db_shell_logs_in() {
    let env = Env::start("engines").await;
    env.create("pg", "postgres", "16.2").await;
    env.create("maria", "mysql", "8.0").await;

    let pg = env.wait_ready("pg").await;
    // Ready came from the agent: the engine accepts the app user the moment Ready is seen.
    let out = env.shell_ok("pg", "select 1").await;
    assert_eq!(
        out.trim().lines().find(|l| l.trim() == "1").map(str::trim),
        Some("1"),
        "{out}"
    );
    let status = pg.status.unwrap();
    assert_eq!(status.ready_replicas, 1);
    assert_eq!(status.current_version.as_deref(), Some("16.2"));
    let instance = &status.instances[0];
    assert_eq!(instance.name, "pg-0");
    assert!(instance.ready);
    assert_eq!(instance.role.as_deref(), Some("primary"));
    assert_eq!(instance.timeline, Some(1));
    let report = env.report("pg-0").await;
    assert!(
        report
            .engine_version
            .as_deref()
            .is_some_and(|v| v.starts_with("16.")),
        "the image declares 16.2: PostgreSQL 16 runs, not another major: {report:?}"
    );
    assert!(report.system_identifier.is_some());
    // The app user is an ordinary role, not the superuser.
    let out = env
        .shell_ok(
            "pg",
            "select rolsuper from pg_roles where rolname = current_user",
        )
        .await;
    assert!(out.lines().any(|l| l.trim() == "f"), "{out}");

    env.wait_ready("maria").await;
    let out = env.shell_ok("maria", "select 1").await;
    assert!(out.lines().any(|l| l.trim() == "1"), "{out}");
    let report = env.report("maria-0").await;
    assert!(
        report
            .engine_version
            .as_deref()
            .is_some_and(|v| v.starts_with("10.")),
        "{report:?}"
    );
    // MariaDB has no server_uuid: the agent's identifier of the data directory stands in.
    assert!(report.system_identifier.is_some(), "{report:?}");
    // Every key the report documents is there, null when it does not apply (a primary has no
    // received position, MariaDB no timeline).
    for pod in ["pg-0", "maria-0"] {
        let annotations = env
            .api::<Pod>()
            .get(pod)
            .await
            .unwrap()
            .metadata
            .annotations;
        let raw: serde_json::Value = serde_json::from_str(
            &annotations.unwrap_or_default()[devctl_api::instance::STATUS_ANNOTATION],
        )
        .unwrap();
        for key in [
            "role",
            "ready",
            "systemIdentifier",
            "timeline",
            "receivedLSN",
            "replayedLSN",
            "lagBytes",
            "engineVersion",
            "address",
            "heartbeat",
            "lastError",
        ] {
            assert!(raw.get(key).is_some(), "{pod}: no {key} in {raw}");
        }
    }

    // `db status` lists each instance.
    let out = env.devctl_ok(&["db", "status", "pg"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("pg-0") && l.contains("primary") && l.contains("true")),
        "{out}"
    );
    // The engine is killed: its agent restarts it on the same data, and the cluster says so
    // once healed — the instance's restarts and how it exited, one Warning event, a RESTARTS
    // column in `db status`.
    let runner = env.cluster.pod_runner().unwrap();
    let claim = runner.claim_dir(&env.namespace, "data-pg-0").unwrap();
    let postmaster: i32 = std::fs::read_to_string(claim.join("data/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(postmaster, libc::SIGKILL) };
    let pg = env
        .wait_db("pg", "the restart recorded and Ready again", |db| {
            ready(db)
                && db.status.as_ref().is_some_and(|s| {
                    s.instances
                        .iter()
                        .any(|i| i.name == "pg-0" && i.ready && i.restarts == Some(1))
                })
        })
        .await;
    let instance = &pg.status.unwrap().instances[0];
    assert!(
        instance
            .last_exit
            .as_deref()
            .is_some_and(|e| e.contains("SIGKILL")),
        "{instance:?}"
    );
    let restarted: Vec<String> = env
        .events("EngineRestarted")
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect();
    assert_eq!(restarted.len(), 1, "{restarted:?}");
    assert!(
        restarted[0].starts_with("pg-0: postgres exited (signal: 9 (SIGKILL))"),
        "{restarted:?}"
    );
    let out = env.devctl_ok(&["db", "status", "pg"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("pg-0") && l.contains(" 1 (")),
        "{out}"
    );
    assert!(out.contains("RESTARTS"), "{out}");

    // A failing statement is the client's non-zero exit code.
    let out = env.shell("pg", "select * from no_such_table").await;
    assert!(!out.status.success());

    for name in ["pg", "maria"] {
        let password = env.password(name).await;
        env.assert_never_shown(&password).await;
    }

    // Two `db backup`s back to back (most often within one second, the names' resolution):
    // both are created, under two names, labelled with their cluster (what becomes of them
    // without a store is the backup tests' business).
    let kubeconfig = env.kubeconfig.clone();
    let created = tokio::task::spawn_blocking(move || {
        [0, 1].map(|_| support::devctl_ok(&kubeconfig, &["db", "backup", "maria"]))
    })
    .await
    .unwrap();
    let backups = env
        .api::<devctl_api::database_backup::DatabaseBackup>()
        .list(&kube::api::ListParams::default().labels("db.devctl.io/cluster=maria"))
        .await
        .unwrap();
    assert_eq!(backups.items.len(), 2, "{created:?}");
    for backup in &backups.items {
        let name = backup.metadata.name.clone().unwrap();
        assert!(created.iter().any(|out| out.contains(&name)), "{created:?}");
    }

    // MariaDB's agent does not bootstrap an empty database in place of lost data either.
    a_lost_volume_is_never_reinitialised(&env, "maria").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_follow_the_secret_and_a_lost_secret_is_regenerated() {
    let env = Env::start("passwords").await;
    env.create("pw", "postgres", "16.2").await;
    env.wait_ready("pw").await;
    let old = env.password("pw").await;
    let login = env.psql_login("pw-0", &old).await;
    assert!(login.status.success(), "{login:?}");

    // A user rotates the password in the Secret.
    let new = "rotated-by-the-user-0123456789";
    let secrets = env.api::<Secret>();
    set_password(&env, "pw-credentials", new).await;
    devctl_testenv::eventually("the new password to log in", READY_TIMEOUT, || async {
        env.psql_login("pw-0", new)
            .await
            .status
            .success()
            .then_some(())
    })
    .await
    .unwrap();
    let refused = env.psql_login("pw-0", &old).await;
    assert!(!refused.status.success(), "the old password still logs in");

    // The Secret is lost: a new password is generated and reaches the database. The
    // condition clears as soon as the agent applied it: watched from before the delete.
    let since = env.mark_db("pw").await;
    secrets
        .delete("pw-credentials", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_db_since(&since, "CredentialsRegenerated", |db| {
        condition(db, "Degraded")
            .is_some_and(|(s, r, _)| s == "True" && r == "CredentialsRegenerated")
    })
    .await;
    env.wait_db("pw", "CredentialsRegenerated cleared", |db| {
        ready(db) && condition(db, "Degraded").is_some_and(|(s, _, _)| s == "False")
    })
    .await;
    let regenerated = env.password("pw").await;
    assert_ne!(regenerated, new);
    let login = env.psql_login("pw-0", &regenerated).await;
    assert!(login.status.success(), "{login:?}");
    assert!(!env.psql_login("pw-0", new).await.status.success());
    for password in [old.as_str(), new, regenerated.as_str()] {
        env.assert_never_shown(password).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pod_comes_back_on_its_data_a_lost_volume_is_never_reinitialised_and_rbac_goes_with_the_cluster()
 {
    let env = Env::start("restart").await;
    env.create("keep", "postgres", "16.2").await;
    env.wait_ready("keep").await;
    env.shell_ok("keep", "create table t (v int); insert into t values (42)")
        .await;
    let before = env.report("keep-0").await.system_identifier;
    let old_uid = env.api::<Pod>().get("keep-0").await.unwrap().metadata.uid;

    env.api::<Pod>()
        .delete("keep-0", &DeleteParams::default())
        .await
        .unwrap();
    devctl_testenv::eventually(
        "a new keep-0 with a ready report",
        READY_TIMEOUT,
        || async {
            let pod = env.api::<Pod>().get_opt("keep-0").await.ok()??;
            let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
            (pod.metadata.uid != old_uid && report.ready).then_some(())
        },
    )
    .await
    .unwrap();
    assert_eq!(env.report("keep-0").await.system_identifier, before);
    let out = env.shell_ok("keep", "select v from t").await;
    assert!(out.lines().any(|l| l.trim() == "42"), "{out}");

    // Its volume lost as well: the new pod must not put an empty database in place of the
    // data (initdb would, and the cluster would look healthy).
    a_lost_volume_is_never_reinitialised(&env, "keep").await;

    // The agents' ServiceAccount, Role and RoleBinding are the cluster's and go with it.
    assert!(
        env.api::<ServiceAccount>()
            .get_opt("keep-agent")
            .await
            .unwrap()
            .is_some()
    );
    // `db delete --wait` returns once the operator's finalizer let the cluster go.
    let kubeconfig = env.kubeconfig.clone();
    let deleted = tokio::task::spawn_blocking(move || {
        support::devctl_ok(&kubeconfig, &["db", "delete", "keep", "--wait"])
    })
    .await
    .unwrap();
    assert!(
        env.api::<DatabaseCluster>()
            .get_opt("keep")
            .await
            .unwrap()
            .is_none(),
        "still there after db delete --wait: {deleted}"
    );
    assert!(
        deleted.contains("deleted (its volumes are deleted with it)"),
        "{deleted}"
    );
    // Its data goes with it: a cluster made again under this name starts empty.
    devctl_testenv::eventually("the data claim to be deleted", READY_TIMEOUT, || async {
        let claim = env
            .api::<PersistentVolumeClaim>()
            .get_opt("data-keep-0")
            .await
            .ok()?;
        claim.is_none().then_some(())
    })
    .await
    .unwrap();
    devctl_testenv::eventually("the agent RBAC to be collected", READY_TIMEOUT, || async {
        let sa = env
            .api::<ServiceAccount>()
            .get_opt("keep-agent")
            .await
            .ok()?;
        let role = env.api::<Role>().get_opt("keep-agent").await.ok()?;
        let binding = env.api::<RoleBinding>().get_opt("keep-agent").await.ok()?;
        (sa.is_none() && role.is_none() && binding.is_none()).then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_denied_by_its_role_fails_loudly_and_the_cluster_says_why() {
    let mut env = Env::start("denied").await;
    env.create("deny", "postgres", "16.2").await;
    env.wait_ready("deny").await;
    // The agent acts as its cluster's ServiceAccount, not as an administrator.
    let runner = env.cluster.pod_runner().unwrap();

    // Take the Secret rule away (the operator would put it back: stop it first).
    env.stop_operator();
    let roles = env.api::<Role>();
    let role = roles.get("deny-agent").await.unwrap();
    let rules: Vec<_> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|r| {
            !r.resources
                .as_ref()
                .is_some_and(|res| res.iter().any(|x| x == "secrets"))
        })
        .collect();
    roles
        .patch(
            "deny-agent",
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": rules })),
        )
        .await
        .unwrap();
    env.api::<Pod>()
        .delete("deny-0", &DeleteParams::default())
        .await
        .unwrap();
    let report = devctl_testenv::eventually(
        "the agent to report it is forbidden",
        READY_TIMEOUT,
        || async {
            let pod = env.api::<Pod>().get_opt("deny-0").await.ok()??;
            let report = InstanceStatus::from_annotations(pod.metadata.annotations.as_ref())?;
            report
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("forbidden"))
                .then_some(report)
        },
    )
    .await
    .unwrap();
    assert!(!report.ready);
    // It reports first, then exits.
    let namespace = env.namespace.clone();
    devctl_testenv::eventually(
        "the agent to exit 77 (EX_NOPERM) when the API server forbids it",
        READY_TIMEOUT,
        || async {
            runner
                .exits(&namespace, "deny-0")
                .iter()
                .any(|e| e.code == Some(77))
                .then_some(())
        },
    )
    .await
    .unwrap();

    // The operator comes back: its first look says why the instance is down, then it puts
    // the rule back and the agent recovers.
    let said_why = tokio::spawn({
        let api = env.api::<DatabaseCluster>();
        async move {
            await_condition(api, "deny", |db: Option<&DatabaseCluster>| {
                db.and_then(|d| d.status.as_ref()).is_some_and(|s| {
                    s.instances.iter().any(|i| {
                        i.message
                            .as_deref()
                            .is_some_and(|m| m.contains("forbidden"))
                    })
                })
            })
            .await
        }
    });
    env.start_operator();
    let db = tokio::time::timeout(READY_TIMEOUT, said_why)
        .await
        .expect("status.instances never said the agent is forbidden")
        .unwrap()
        .unwrap()
        .unwrap();
    let (status, _, message) = condition(&db, "Ready").unwrap();
    assert_eq!(status, "False");
    assert!(message.contains("forbidden"), "{message}");
    env.wait_ready("deny").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_alter_role_never_logs_the_password_verifier() {
    let env = Env::start("verifier").await;
    env.create("vf", "postgres", "16.2").await;
    env.wait_ready("vf").await;
    // The agent's sessions (database postgres) become read-only: its next ALTER ROLE fails.
    env.superuser_sql(
        "vf-0",
        "alter database postgres set default_transaction_read_only = on",
    )
    .await;
    let new = "rotated-while-read-only-0123456789";
    set_password(&env, "vf-credentials", new).await;
    devctl_testenv::eventually(
        "the failed ALTER ROLE in the engine's log",
        READY_TIMEOUT,
        || async {
            env.agent_log_all("vf-0")
                .contains("cannot execute ALTER ROLE in a read-only transaction")
                .then_some(())
        },
    )
    .await
    .unwrap();
    let log = env.agent_log_all("vf-0");
    assert!(
        !log.contains("SCRAM-SHA-256$"),
        "the engine logged a password verifier:\n{}",
        log.lines()
            .filter(|l| l.contains("SCRAM-SHA-256$"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Writable again: the new password arrives.
    env.superuser_sql(
        "vf-0",
        "alter database postgres reset default_transaction_read_only",
    )
    .await;
    devctl_testenv::eventually("the new password to log in", READY_TIMEOUT, || async {
        env.psql_login("vf-0", new)
            .await
            .status
            .success()
            .then_some(())
    })
    .await
    .unwrap();
    env.assert_never_shown(new).await;
}

/// A user's rotation: `password` into the credentials Secret `secret`.
async fn set_password(env: &Env, secret: &str, password: &str) {
    env.api::<Secret>()
        .patch(
            secret,
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "data": { "password": ByteString(password.as_bytes().to_vec()) } }),
            ),
        )
        .await
        .unwrap();
}
