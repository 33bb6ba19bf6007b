//! SQL as the engine's superuser on a process-backed pod, the way its agent connects: peer
//! authentication on the pod's private socket. For what a test must do behind the agent's
//! back (CHECKPOINT, `pg_switch_wal()`, a promotion the agent did not ask for), which the
//! application role may not.

use std::path::PathBuf;

use super::PodRunner;
use crate::Error;

impl PodRunner {
    /// Runs `sql` as `postgres` in database `app` on `pod`'s PostgreSQL (unaligned, tuples
    /// only); its output, trimmed. The socket directory comes from the agent's
    /// `DEVCTL_RUN_DIR`, `psql` from beside the engine's own binary.
    pub async fn superuser_sql(
        &self,
        namespace: &str,
        pod: &str,
        sql: &str,
    ) -> Result<String, Error> {
        self.require_processes("superuser_sql")?;
        let pids = self.agent_pids(namespace, pod);
        let what = format!("pod {namespace}/{pod}");
        let agent = *pids
            .first()
            .ok_or_else(|| Error::Process(format!("no agent runs for {what}")))?;
        let environ = std::fs::read(format!("/proc/{agent}/environ"))
            .map_err(|e| Error::io(format!("read the environment of {what}'s agent"), e))?;
        let run_dir = environ
            .split(|b| *b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok())
            .find_map(|kv| kv.strip_prefix("DEVCTL_RUN_DIR="))
            .map(PathBuf::from)
            .ok_or_else(|| Error::Process(format!("{what}'s agent has no DEVCTL_RUN_DIR")))?;
        let psql = pids
            .iter()
            .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).ok())
            .find(|exe| exe.file_name().is_some_and(|n| n == "postgres"))
            .map(|exe| exe.with_file_name("psql"))
            .ok_or_else(|| Error::Process(format!("no postgres runs for {what}")))?;
        let port = std::fs::read_dir(&run_dir)
            .map_err(|e| Error::io(format!("list {}", run_dir.display()), e))?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|n| {
                n.strip_prefix(".s.PGSQL.")
                    .filter(|p| !p.contains('.'))
                    .map(str::to_string)
            })
            .ok_or_else(|| {
                Error::Process(format!("no PostgreSQL socket in {}", run_dir.display()))
            })?;
        let out = tokio::process::Command::new(&psql)
            .arg("-h")
            .arg(&run_dir)
            .args(["-p", &port, "-U", "postgres", "-d", "app", "-X", "-A", "-t"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| Error::io(format!("run {}", psql.display()), e))?;
        if !out.status.success() {
            return Err(Error::Process(format!(
                "psql as postgres on {what} -c {sql:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}
