//! The agent's errors and the exit code each maps to (see the crate docs).

/// Everything that stops the agent. Every message is one line and never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A missing or malformed environment variable or argument.
    #[error("{0}")]
    Usage(String),
    /// The credentials Secret's content is unusable (e.g. an empty password).
    #[error("{0}")]
    Credentials(String),
    /// The engine's binaries are missing, or it failed to bootstrap or keeps failing.
    #[error("{0}")]
    Engine(String),
    /// The data (or run) directory cannot be created or written.
    #[error("{0}")]
    DataDir(String),
    /// A configuration file the operator renders is missing.
    #[error("{0}")]
    Config(String),
    /// The API server refused a request (RBAC).
    #[error("{0}")]
    Forbidden(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `EX_USAGE`: bad or missing environment variable or argument.
pub const EXIT_USAGE: i32 = 64;
/// `EX_DATAERR`: the credentials Secret's content is unusable.
pub const EXIT_CREDENTIALS: i32 = 65;
/// `EX_UNAVAILABLE`: engine binary not found, bootstrap failed or the engine keeps failing.
pub const EXIT_ENGINE: i32 = 69;
/// `EX_SOFTWARE`: internal error.
pub const EXIT_INTERNAL: i32 = 70;
/// `EX_CANTCREAT`: the data or run directory cannot be created or written.
pub const EXIT_DATA_DIR: i32 = 73;
/// `EX_NOPERM`: forbidden by the API server.
pub const EXIT_FORBIDDEN: i32 = 77;
/// `EX_CONFIG`: a rendered configuration file is missing.
pub const EXIT_CONFIG: i32 = 78;

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => EXIT_USAGE,
            Error::Credentials(_) => EXIT_CREDENTIALS,
            Error::Engine(_) => EXIT_ENGINE,
            Error::DataDir(_) => EXIT_DATA_DIR,
            Error::Config(_) => EXIT_CONFIG,
            Error::Forbidden(_) => EXIT_FORBIDDEN,
            Error::Internal(_) => EXIT_INTERNAL,
        }
    }

    /// The message on one line (newlines of wrapped errors folded into spaces).
    pub fn one_line(&self) -> String {
        one_line(&self.to_string())
    }

    /// Maps a Kubernetes API error: 403 becomes [`Error::Forbidden`].
    pub fn kube(context: &str, error: &kube::Error) -> Self {
        if is_forbidden(error) {
            Error::Forbidden(format!(
                "{context}: forbidden by the API server: {}",
                one_line(&error.to_string())
            ))
        } else {
            Error::Internal(format!("{context}: {}", one_line(&error.to_string())))
        }
    }
}

/// Whether the API server answered 403.
pub fn is_forbidden(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 403)
}

/// Folds `text` onto one line.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
