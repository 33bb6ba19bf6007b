//! The Secrets the agent follows: the credentials (the application role) and the replication
//! Secret (the streaming role and the replicas' password file).

use super::*;

/// What the credentials watch has seen.
#[derive(Clone, Debug, Default)]
pub(crate) struct SecretView {
    /// The initial list completed.
    pub listed: bool,
    pub secret: Option<Secret>,
    /// The last watch error (message, forbidden) since the last successful event.
    pub error: Option<(String, bool)>,
}

impl SecretView {
    /// What keeps the `what` Secret `name` from being used, for `lastError`.
    pub(super) fn problem(&self, what: &str, name: &str) -> Option<String> {
        if let Some((message, _)) = &self.error {
            Some(format!("watching {what} Secret {name}: {message}"))
        } else if self.listed && self.secret.is_none() {
            Some(format!("{what} Secret {name} not found"))
        } else {
            None
        }
    }
}

/// Takes in `secret` when its `resourceVersion` is newer than `seen`: parsed into `desired`,
/// or — when its content is unusable — reported in `invalid` while the previous password
/// stays in force.
pub(super) fn take_in_secret<C>(
    secret: &Secret,
    seen: &mut Option<String>,
    desired: &mut Option<C>,
    invalid: &mut Option<String>,
    parse: impl Fn(&Secret) -> Result<C>,
) {
    let version = secret.metadata.resource_version.clone();
    if version == *seen {
        return;
    }
    *seen = version;
    match parse(secret) {
        Ok(c) => {
            *desired = Some(c);
            *invalid = None;
        }
        Err(e) => {
            let message = format!("{}; keeping the previous password", e.one_line());
            tracing::error!("{message}");
            *invalid = Some(message);
        }
    }
}

/// Watches one Secret (field selector on its name: the agent's Role allows only that name,
/// so it never lists all Secrets).
pub(crate) fn watch_secret(
    client: kube::Client,
    namespace: &str,
    name: &str,
    what: &'static str,
) -> watch::Receiver<SecretView> {
    let (tx, rx) = watch::channel(SecretView::default());
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let fields = format!("metadata.name={name}");
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().fields(&fields))
            .default_backoff()
            .boxed();
        let mut buffer = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init) => buffer = None,
                Ok(watcher::Event::InitApply(s)) => buffer = Some(s),
                Ok(watcher::Event::InitDone) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = buffer.take();
                    v.error = None;
                }),
                Ok(watcher::Event::Apply(s)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = Some(s);
                    v.error = None;
                }),
                Ok(watcher::Event::Delete(_)) => tx.send_modify(|v| {
                    v.listed = true;
                    v.secret = None;
                    v.error = None;
                }),
                Err(e) => {
                    let forbidden = watch_error_is_forbidden(&e);
                    let message = one_line(&e.to_string());
                    tracing::warn!("watching the {what} Secret: {message}");
                    tx.send_modify(|v| v.error = Some((message, forbidden)));
                }
            }
        }
    });
    rx
}

impl Agent {
    pub(super) fn passfile(&self) -> std::path::PathBuf {
        self.config.run_dir.join(REPLICATION_PASSFILE)
    }

    pub(super) fn replication_user(&self) -> String {
        self.replication_desired
            .as_ref()
            .map(|r| r.username.clone())
            .unwrap_or_else(|| REPLICATION_USER.to_string())
    }

    /// Writes the replication password file (0600) when the Secret's version changed.
    pub(super) fn write_passfile(&mut self) -> Result<(), String> {
        let Some(replication) = &self.replication_desired else {
            return Ok(());
        };
        if self.passfile_version.as_deref() == Some(replication.version.as_str())
            && self.passfile().is_file()
        {
            return Ok(());
        }
        let line = pgpass_line(&replication.username, &replication.password);
        write_private(&self.passfile(), line.as_bytes())?;
        self.passfile_version = Some(replication.version.clone());
        Ok(())
    }

    /// Takes in the replication Secret's latest state (forbidden is fatal before the engine
    /// runs, only reported after).
    pub(super) fn refresh_replication_secret(&mut self) -> Result<()> {
        let Some(rx) = &mut self.replication else {
            return Ok(());
        };
        let view = rx.borrow_and_update().clone();
        let name = self.config.replication_secret.clone().unwrap_or_default();
        if let Some((message, true)) = &view.error
            && self.probe.is_none()
        {
            return Err(Error::Forbidden(format!(
                "watching replication Secret {name}: {message}"
            )));
        }
        self.replication_problem = view.problem("replication", &name);
        if let Some(secret) = &view.secret {
            take_in_secret(
                secret,
                &mut self.replication_seen,
                &mut self.replication_desired,
                &mut self.replication_invalid,
                ReplicationCredentials::from_secret,
            );
        }
        Ok(())
    }

    /// Waits until the credentials Secret exists and is valid (exit 65 when it is not,
    /// 77 when watching it is forbidden), reporting while it is missing.
    pub(super) async fn wait_for_credentials(&mut self) -> Result<Result<Credentials, Outcome>> {
        let name = self.config.credentials_secret.clone();
        loop {
            let view = self.secrets.borrow_and_update().clone();
            let problem = if let Some((message, forbidden)) = view.error {
                if forbidden {
                    return Err(Error::Forbidden(format!(
                        "watching credentials Secret {name}: {message}"
                    )));
                }
                Some(format!("watching credentials Secret {name}: {message}"))
            } else if view.listed {
                match view.secret {
                    Some(secret) => return Credentials::from_secret(&secret).map(Ok),
                    None => Some(format!("credentials Secret {name} not found")),
                }
            } else {
                None
            };
            if let Some(problem) = problem {
                tracing::warn!("{problem}; waiting");
                self.secret_problem = Some(problem);
                if let Some(outcome) = self.report().await? {
                    return Ok(Err(outcome));
                }
            }
            tokio::select! {
                changed = self.secrets.changed() => {
                    if changed.is_err() {
                        return Err(Error::Internal("the credentials watch ended".into()));
                    }
                }
                _ = self.sigterm.recv() => return Ok(Err(Outcome::Stopped)),
                _ = self.sigint.recv() => return Ok(Err(Outcome::Stopped)),
            }
        }
    }
}
