//! The operator under test as a process of its own, so that a fault can SIGKILL it and start
//! it again, as a node losing the operator's pod would. It runs as the installed Deployment
//! runs it: leader election on (a SIGKILLed leader's Lease must run out before the next one
//! leads), one namespace watched, no webhooks (the campaign writes only valid specs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use crate::Error;

/// The operator process; killed on drop.
pub struct OperatorProcess {
    binary: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
    log_dir: PathBuf,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    child: Option<Child>,
    /// How many faults hold it down: it starts again when the last one ends.
    held_down: u32,
    runs: u32,
}

impl OperatorProcess {
    /// Starts `binary` against the API server of `kubeconfig`, watching `namespace` (which
    /// holds its leader Lease too); its logs go to `log_dir/operator.<run>.log`.
    pub fn start(
        binary: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log_dir: &Path,
    ) -> Result<Self, Error> {
        let operator = Self {
            binary: binary.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            namespace: namespace.to_string(),
            log_dir: log_dir.to_path_buf(),
            state: Mutex::new(State::default()),
        };
        {
            let mut state = operator.lock();
            operator.spawn(&mut state)?;
        }
        Ok(operator)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn spawn(&self, state: &mut State) -> Result<(), Error> {
        state.runs += 1;
        let path = self.log_dir.join(format!("operator.{}.log", state.runs));
        let log = std::fs::File::create(&path)
            .map_err(|e| Error::io(format!("create {}", path.display()), e))?;
        let child = Command::new(&self.binary)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", &self.namespace])
            .arg("--leader-elect")
            .args(["--leader-election-namespace", &self.namespace])
            .args(["--metrics-bind-address", "off"])
            .args(["--webhook-bind-address", "off"])
            .env_remove("DEVCTL_WEBHOOK_BIND_ADDRESS")
            .env_remove("DEVCTL_WATCH_NAMESPACES")
            .env("DEVCTL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| Error::io(format!("start {}", self.binary.display()), e))?;
        state.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the operator (if it runs) and keeps it down until [`Self::release`] was
    /// called as often as this.
    pub fn kill_and_hold(&self) {
        let mut state = self.lock();
        state.held_down += 1;
        if let Some(mut child) = state.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Ends one [`Self::kill_and_hold`]; the last one starts the operator again.
    pub fn release(&self) -> Result<(), Error> {
        let mut state = self.lock();
        state.held_down = state.held_down.saturating_sub(1);
        if state.held_down == 0 && state.child.is_none() {
            self.spawn(&mut state)?;
        }
        Ok(())
    }

    /// Whether the process that should run still does (it did not exit on its own).
    pub fn check(&self) -> Result<(), Error> {
        let mut state = self.lock();
        match state.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(status))) => Err(Error::Process(format!(
                "the operator exited on its own ({status}); logs in {}",
                self.log_dir.display()
            ))),
            _ => Ok(()),
        }
    }

    /// Where its logs are.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
