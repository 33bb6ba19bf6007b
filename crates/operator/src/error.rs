//! The operator's one error type.

use std::time::Duration;

/// The API server's own message for API errors (it names the field and the rule), the
/// error's display otherwise.
pub fn describe(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {}", describe(.0))]
    Kube(#[from] kube::Error),

    #[error("{action} {kind} {name}: {}", describe(source))]
    Child {
        action: &'static str,
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),

    #[error("object has no {0}")]
    MissingField(&'static str),

    #[error("cleanup did not finish within {0:?}")]
    CleanupTimeout(Duration),

    #[error("rendering a {kind}: {source}")]
    Render {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("rendering a {kind}: {path} is not a field of {kind}")]
    UnknownField { kind: &'static str, path: String },

    #[error("{kind} {name} changed while it was being reconciled; reconciling again")]
    StaleChild { kind: &'static str, name: String },

    #[error("{kind} {name} exists already; it is read and the cluster reconciled again")]
    ChildExists { kind: &'static str, name: String },

    #[error("no cache is registered for child kind {0}")]
    UnregisteredKind(&'static str),

    #[error("cannot watch {kind}: {message}")]
    CacheUnavailable {
        kind: &'static str,
        message: String,
        forbidden: bool,
    },

    #[error(
        "Secret {name} exists and is not owned by this cluster; devctl never touches it. Delete or rename it, or choose another cluster name"
    )]
    CredentialsSecretNotOwned { name: String },

    #[error(
        "{kind} {name} exists and is not owned by this resource ({detail}); devctl left it as it was. Delete or rename it, or choose another name for this resource"
    )]
    ChildNotOwned {
        kind: &'static str,
        name: String,
        detail: String,
    },

    #[error(
        "{kind} {name} still belongs to the deleted {previous}; waiting for the garbage collector to remove it"
    )]
    ChildOfDeletedOwner {
        kind: &'static str,
        name: String,
        previous: String,
    },
}

impl Error {
    /// A CamelCase reason for conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Child { source, .. } | Error::Kube(source) => match source {
                kube::Error::Api(status) if status.code == 403 => "Forbidden",
                kube::Error::Api(status) if status.code == 409 => "Conflict",
                kube::Error::Api(status) if status.code == 422 => "Invalid",
                _ => "ApiError",
            },
            Error::Finalizer(_) => "FinalizerError",
            Error::MissingField(_)
            | Error::Render { .. }
            | Error::UnknownField { .. }
            | Error::UnregisteredKind(_) => "InternalError",
            Error::CredentialsSecretNotOwned { .. } => "CredentialsSecretNotOwned",
            Error::ChildNotOwned { .. } => "ChildNotOwned",
            Error::CacheUnavailable {
                forbidden: true, ..
            } => "Forbidden",
            Error::CacheUnavailable { .. } => "WatchFailed",
            Error::CleanupTimeout(_) => "CleanupTimeout",
            Error::StaleChild { .. } | Error::ChildExists { .. } => "Conflict",
            Error::ChildOfDeletedOwner { .. } => "WaitingForGarbageCollection",
        }
    }
}

/// A failed reconcile as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason for conditions and events.
    pub reason: &'static str,
    pub message: String,
    /// Retrying will not help until a human changes something (RBAC, an admission policy,
    /// the spec, a foreign object in the way): reported as `Stalled=True`.
    pub permanent: bool,
}

impl Error {
    pub fn failure(&self) -> Failure {
        Failure {
            reason: self.reason(),
            message: self.to_string(),
            permanent: self.is_permanent(),
        }
    }

    /// Whether the same request will fail again until something outside the operator changes.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Child { source, .. } | Error::Kube(source) => matches!(
                source,
                kube::Error::Api(status) if matches!(status.code, 400 | 403 | 422)
            ),
            Error::CredentialsSecretNotOwned { .. }
            | Error::ChildNotOwned { .. }
            | Error::Render { .. }
            | Error::UnknownField { .. }
            | Error::UnregisteredKind(_)
            | Error::MissingField(_) => true,
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.is_permanent(),
                _ => false,
            },
            Error::CacheUnavailable { forbidden, .. } => *forbidden,
            Error::CleanupTimeout(_)
            | Error::StaleChild { .. }
            | Error::ChildExists { .. }
            | Error::ChildOfDeletedOwner { .. } => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
