//! The agent's inputs, read from the environment the operator sets
//! ([`devctl_api::instance::env`]).

use std::path::{Path, PathBuf};

use devctl_api::instance::{DEFAULT_HEALTH_PORT, env};

use crate::error::{Error, Result};

/// Which engine family the pod runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Postgres,
    /// One instance of MySQL (or MariaDB standing in for it), no replication.
    Mysql,
    /// Replicated MariaDB (docs/mariadb.md).
    Mariadb,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Postgres => "postgres",
            EngineKind::Mysql => "mysql",
            EngineKind::Mariadb => "mariadb",
        }
    }

    /// Replicas, the primary lock and failover: the agent follows the cluster's status.
    pub fn replicated(self) -> bool {
        matches!(self, EngineKind::Postgres | EngineKind::Mariadb)
    }
}

/// The replication-related environment variables (defined with the rest of the contract in
/// [`devctl_api::instance::env`]). `REPLICATION_SECRET` is optional on a primary (no
/// replication role is managed without it) and required on a replica that has to clone.
pub mod extra_env {
    pub use devctl_api::instance::env::{PRIMARY_FROM, PRIMARY_SERVICE_HOST, REPLICATION_SECRET};
}

/// Where a replica takes the primary's address from ([`extra_env::PRIMARY_FROM`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrimaryFrom {
    /// `host:DEVCTL_PORT`, `host` being the `-rw` Service's DNS name (or
    /// [`extra_env::PRIMARY_SERVICE_HOST`]).
    Service { host: String },
    /// The `address` of the primary pod's `db.devctl.io/instance-status` report.
    Annotation,
}

/// Everything the agent is told by its environment.
#[derive(Clone, Debug)]
pub struct Config {
    pub engine: EngineKind,
    pub cluster: String,
    pub credentials_secret: String,
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub pod_ip: String,
    pub data_dir: PathBuf,
    pub config_dir: PathBuf,
    pub run_dir: PathBuf,
    pub port: u16,
    pub listen_address: String,
    pub health_port: u16,
    pub engine_bin_dir: Option<PathBuf>,
    pub replication_secret: Option<String>,
    pub primary_from: PrimaryFrom,
    /// `DEVCTL_BOOTSTRAP=recovery`: the first instance restores a backup instead of
    /// initialising (docs/backup.md).
    pub recovery: bool,
}

/// The pod identity, when the environment names it (used to report even a bad
/// configuration on the pod).
#[derive(Clone, Debug)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
}

impl PodRef {
    /// `POD_NAME`/`POD_NAMESPACE` (and `POD_UID` if set) from `lookup`, if both are set.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        Some(PodRef {
            name: get(env::POD_NAME)?,
            namespace: get(env::POD_NAMESPACE)?,
            uid: get(env::POD_UID),
        })
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (testable without touching the process env).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let required = |name: &str| -> Result<String> {
            match lookup(name) {
                None => Err(Error::Usage(format!("missing environment variable {name}"))),
                Some(v) if v.trim().is_empty() => Err(Error::Usage(format!(
                    "environment variable {name} is empty"
                ))),
                Some(v) => Ok(v.trim().to_string()),
            }
        };
        let path = |name: &str| -> Result<PathBuf> {
            let value = required(name)?;
            let path = PathBuf::from(&value);
            if !path.is_absolute() {
                return Err(Error::Usage(format!(
                    "environment variable {name} must be an absolute path, got {value:?}"
                )));
            }
            Ok(path)
        };
        let port = |name: &str, value: String| -> Result<u16> {
            match value.parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(Error::Usage(format!(
                    "environment variable {name} must be a port number (1-65535), got {value:?}"
                ))),
            }
        };
        let engine = match required(env::ENGINE)?.as_str() {
            "postgres" => EngineKind::Postgres,
            "mysql" => EngineKind::Mysql,
            "mariadb" => EngineKind::Mariadb,
            other => {
                return Err(Error::Usage(format!(
                    "environment variable {} must be postgres, mariadb or mysql, got {other:?}",
                    env::ENGINE
                )));
            }
        };
        let name_like = |name: &str| -> Result<String> {
            let value = required(name)?;
            if value.chars().any(|c| c.is_control() || c == '/') {
                return Err(Error::Usage(format!(
                    "environment variable {name} is not a valid object name"
                )));
            }
            Ok(value)
        };
        let health_port = match lookup(env::HEALTH_PORT).filter(|v| !v.trim().is_empty()) {
            None => DEFAULT_HEALTH_PORT,
            Some(v) => port(env::HEALTH_PORT, v.trim().to_string())?,
        };
        let engine_bin_dir = match lookup(env::ENGINE_BIN_DIR).filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(_) => Some(path(env::ENGINE_BIN_DIR)?),
        };
        let cluster = name_like(env::CLUSTER)?;
        let pod_namespace = name_like(env::POD_NAMESPACE)?;
        let optional = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let replication_secret = match optional(extra_env::REPLICATION_SECRET) {
            None => None,
            Some(_) => Some(name_like(extra_env::REPLICATION_SECRET)?),
        };
        let primary_from = match optional(extra_env::PRIMARY_FROM).as_deref().map(str::trim) {
            None | Some("service") => PrimaryFrom::Service {
                host: match optional(extra_env::PRIMARY_SERVICE_HOST) {
                    Some(host) => {
                        let host = host.trim().to_string();
                        if !host
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':'))
                        {
                            return Err(Error::Usage(format!(
                                "environment variable {} must be a host name, got {host:?}",
                                extra_env::PRIMARY_SERVICE_HOST
                            )));
                        }
                        host
                    }
                    None => format!("{cluster}-rw.{pod_namespace}.svc"),
                },
            },
            Some("annotation") => PrimaryFrom::Annotation,
            Some(other) => {
                return Err(Error::Usage(format!(
                    "environment variable {} must be service or annotation, got {other:?}",
                    extra_env::PRIMARY_FROM
                )));
            }
        };
        let recovery = match optional(env::BOOTSTRAP).as_deref().map(str::trim) {
            None => false,
            Some("recovery") => true,
            Some(other) => {
                return Err(Error::Usage(format!(
                    "environment variable {} must be recovery or unset, got {other:?}",
                    env::BOOTSTRAP
                )));
            }
        };
        Ok(Config {
            recovery,
            engine,
            cluster,
            credentials_secret: name_like(env::CREDENTIALS_SECRET)?,
            pod_name: name_like(env::POD_NAME)?,
            pod_namespace,
            pod_uid: required(env::POD_UID)?,
            pod_ip: required(env::POD_IP)?,
            data_dir: path(env::DATA_DIR)?,
            config_dir: path(env::CONFIG_DIR)?,
            run_dir: path(env::RUN_DIR)?,
            port: port(env::PORT, required(env::PORT)?)?,
            listen_address: required(env::LISTEN_ADDRESS)?,
            health_port,
            engine_bin_dir,
            replication_secret,
            primary_from,
        })
    }

    /// `host:port` as reported in the status (IPv6 addresses bracketed).
    pub fn address(&self) -> String {
        if self.pod_ip.contains(':') {
            format!("[{}]:{}", self.pod_ip, self.port)
        } else {
            format!("{}:{}", self.pod_ip, self.port)
        }
    }

    pub fn config_file(&self, name: &str) -> PathBuf {
        self.config_dir.join(name)
    }
}

/// Fails with [`Error::Config`] when a rendered configuration file is missing.
pub fn require_file(path: &Path) -> Result<()> {
    if path.is_file() {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "configuration file {} is missing (is the ConfigMap mounted at {}?)",
            path.display(),
            env::CONFIG_DIR
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn full() -> HashMap<&'static str, &'static str> {
        HashMap::from([
            (env::ENGINE, "postgres"),
            (env::CLUSTER, "db"),
            (env::CREDENTIALS_SECRET, "db-credentials"),
            (env::POD_NAME, "db-0"),
            (env::POD_NAMESPACE, "ns"),
            (env::POD_UID, "u"),
            (env::POD_IP, "10.0.0.1"),
            (env::DATA_DIR, "/d"),
            (env::CONFIG_DIR, "/c"),
            (env::RUN_DIR, "/r"),
            (env::PORT, "5432"),
            (env::LISTEN_ADDRESS, "*"),
        ])
    }

    fn parse(vars: &HashMap<&'static str, &'static str>) -> Result<Config> {
        Config::from_lookup(|k| vars.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn reads_everything_with_defaults() {
        let config = parse(&full()).unwrap();
        assert_eq!(config.health_port, DEFAULT_HEALTH_PORT);
        assert_eq!(config.address(), "10.0.0.1:5432");
        assert!(config.engine_bin_dir.is_none());
        assert_eq!(config.replication_secret, None);
        assert_eq!(
            config.primary_from,
            PrimaryFrom::Service {
                host: "db-rw.ns.svc".into()
            }
        );
    }

    #[test]
    fn reads_the_replication_settings() {
        let mut vars = full();
        vars.insert(extra_env::REPLICATION_SECRET, "db-replication");
        vars.insert(extra_env::PRIMARY_FROM, "annotation");
        let config = parse(&vars).unwrap();
        assert_eq!(config.replication_secret.as_deref(), Some("db-replication"));
        assert_eq!(config.primary_from, PrimaryFrom::Annotation);
        vars.insert(extra_env::PRIMARY_FROM, "service");
        vars.insert(extra_env::PRIMARY_SERVICE_HOST, "db-rw.ns.svc.example");
        assert_eq!(
            parse(&vars).unwrap().primary_from,
            PrimaryFrom::Service {
                host: "db-rw.ns.svc.example".into()
            }
        );
        assert!(!parse(&vars).unwrap().recovery);
        vars.insert(env::BOOTSTRAP, "recovery");
        assert!(parse(&vars).unwrap().recovery);
        vars.insert(env::BOOTSTRAP, "clone");
        let e = parse(&vars).unwrap_err();
        assert!(e.to_string().contains("DEVCTL_BOOTSTRAP"), "{e}");
        vars.remove(env::BOOTSTRAP);
        vars.insert(extra_env::PRIMARY_FROM, "dns");
        let e = parse(&vars).unwrap_err();
        assert!(e.to_string().contains("DEVCTL_PRIMARY_FROM"), "{e}");
        assert_eq!(e.exit_code(), 64);
    }

    #[test]
    fn names_the_missing_or_bad_variable() {
        let mut vars = full();
        vars.remove(env::ENGINE);
        let e = parse(&vars).unwrap_err();
        assert_eq!(e.to_string(), "missing environment variable DEVCTL_ENGINE");
        assert_eq!(e.exit_code(), 64);
        let mut vars = full();
        vars.insert(env::PORT, "99999");
        assert!(
            parse(&vars)
                .unwrap_err()
                .to_string()
                .contains("DEVCTL_PORT")
        );
        let mut vars = full();
        vars.insert(env::DATA_DIR, "relative");
        assert!(
            parse(&vars)
                .unwrap_err()
                .to_string()
                .contains("DEVCTL_DATA_DIR")
        );
        let mut vars = full();
        vars.insert(env::ENGINE, "oracle");
        assert!(
            parse(&vars)
                .unwrap_err()
                .to_string()
                .contains("postgres, mariadb or mysql")
        );
    }
}
