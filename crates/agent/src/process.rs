//! Child processes: the engine (never outliving the agent), short-lived clients, output
//! forwarding and, when the agent is PID 1, reaping orphaned zombies.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Pids of children a `tokio::process::Child` waits for; the orphan reaper leaves them alone
/// (reaping one would steal its exit status from tokio).
static OWNED: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn owned() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    OWNED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes `command`'s process die with SIGKILL when the agent dies.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked exits, so the agent spawns from
/// its single runtime thread (the binary uses a current-thread tokio runtime), which lives
/// as long as the process.
pub fn die_with_parent(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The agent died before prctl took effect: do not run orphaned.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// Spawns `command` and records its pid as owned until [`release`].
pub fn spawn(command: &mut Command) -> std::io::Result<Child> {
    let mut owned = owned();
    let child = command.spawn()?;
    if let Some(pid) = child.id() {
        owned.insert(pid);
    }
    Ok(child)
}

/// Forgets `pid` once its `Child` was waited for.
pub fn release(pid: Option<u32>) {
    if let Some(pid) = pid {
        owned().remove(&pid);
    }
}

/// The last error line an engine printed (PostgreSQL's `FATAL:`/`PANIC:`, MariaDB's
/// `[ERROR]`), so an exit can be reported with its reason instead of a bare status.
#[derive(Clone, Debug, Default)]
pub struct LastError(Arc<Mutex<Option<(String, std::time::Instant)>>>);

impl LastError {
    fn set(&self, line: String) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((line, std::time::Instant::now()));
    }

    /// The last error line and when it was printed.
    pub fn peek(&self) -> Option<(String, std::time::Instant)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The last error line, forgotten.
    pub fn take(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .map(|(line, _)| line)
    }
}

/// Whether an engine's log line says why it stopped or failed.
fn is_error_line(line: &str) -> bool {
    ["FATAL:", "PANIC:", "[ERROR]"]
        .iter()
        .any(|marker| line.contains(marker))
}

/// Copies `stream` line by line to the agent's stderr, each line prefixed with `prefix`,
/// and keeps the last error line in `last_error`. The returned task ends with the stream.
pub fn forward(
    stream: impl AsyncRead + Unpin + Send + 'static,
    prefix: &'static str,
    last_error: Option<LastError>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    if let Some(last_error) = &last_error {
                        let text = String::from_utf8_lossy(&line);
                        if is_error_line(&text) {
                            last_error.set(text.trim().to_string());
                        }
                    }
                    let mut out = Vec::with_capacity(prefix.len() + line.len());
                    out.extend_from_slice(prefix.as_bytes());
                    out.extend_from_slice(&line);
                    let _ = std::io::stderr().lock().write_all(&out);
                }
            }
        }
    })
}

/// What a client run produced.
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stderr (or stdout) on one line, for error messages.
    pub fn error_line(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        let line = crate::error::one_line(text);
        if line.is_empty() {
            format!("exited with {}", self.status)
        } else {
            line
        }
    }
}

/// Runs `program args` with `stdin` written to its standard input, for at most `timeout`.
/// Secrets go in `stdin`, never in `args`.
pub async fn run(
    program: &Path,
    args: &[String],
    envs: &[(&str, String)],
    cwd: &Path,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Output, String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env_remove("MYSQL_PWD")
        // After the removals: a caller's PGPASSFILE (a 0600 file) is deliberate.
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    die_with_parent(&mut command);
    let name = program.display().to_string();
    let mut child = spawn(&mut command).map_err(|e| format!("cannot run {name}: {e}"))?;
    let pid = child.id();
    let result = tokio::time::timeout(timeout, async {
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin)
                .await
                .map_err(|e| format!("writing to {name}: {e}"))?;
            drop(input);
        }
        child
            .wait_with_output()
            .await
            .map_err(|e| format!("waiting for {name}: {e}"))
    })
    .await;
    release(pid);
    match result {
        Err(_) => Err(format!("{name} did not finish within {timeout:?}")),
        Ok(Err(e)) => Err(e),
        Ok(Ok(output)) => Ok(Output {
            status: output.status,
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }),
    }
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// When the agent is PID 1 (a container's init), reaps zombies reparented to it that no
/// `Child` owns (e.g. grandchildren left behind by the engine).
pub fn reap_orphans() {
    if std::process::id() != 1 {
        return;
    }
    let owned = owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if owned.contains(&pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (fields.next(), fields.next()) else {
            continue;
        };
        if state == "Z" && ppid == "1" {
            let mut status = 0;
            // SAFETY: waitpid on a zombie child of ours; `status` is a valid out-pointer.
            unsafe {
                libc::waitpid(pid as libc::pid_t, &mut status, libc::WNOHANG);
            }
        }
    }
}

/// The effective user's login name (for MariaDB's unix_socket account).
pub fn current_user_name() -> Option<String> {
    // SAFETY: geteuid has no preconditions; getpwuid_r writes into the buffers we own.
    unsafe {
        let uid = libc::geteuid();
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(pwd.pw_name)
            .to_str()
            .ok()
            .map(str::to_string)
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_last_error_line_of_an_engine_is_kept() {
        let output: &[u8] = b"LOG:  starting PostgreSQL 16\n\
            FATAL:  could not create lock file \"postmaster.pid\"\n\
            LOG:  database system is shut down\n\
            2026-12-01 [ERROR] Can't start server: Bind on TCP/IP port\n\
            LOG:  done\n";
        let last_error = LastError::default();
        forward(output, "[test] ", Some(last_error.clone()))
            .await
            .unwrap();
        assert_eq!(
            last_error.take().as_deref(),
            Some("2026-12-01 [ERROR] Can't start server: Bind on TCP/IP port")
        );
    }
}
