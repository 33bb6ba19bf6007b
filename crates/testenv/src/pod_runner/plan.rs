//! What a pod's container asks for (checked before anything starts) and the user its agent
//! runs as.

use std::ffi::CString;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, Pod, Volume};

/// What a pod's container asks for, checked before anything is started.
#[derive(Clone)]
pub(super) struct Plan {
    pub(super) container: Container,
    pub(super) volumes: Vec<Volume>,
    /// The image's name (`postgres`, `mysql`).
    pub(super) engine: String,
    pub(super) run_as: RunAs,
    pub(super) service_account: String,
}

impl Plan {
    pub(super) fn new(pod: &Pod) -> Result<Self, String> {
        let spec = pod.spec.as_ref().ok_or("the pod has no spec")?;
        let container = spec
            .containers
            .first()
            .ok_or("the pod has no container")?
            .clone();
        let command = container.command.clone().unwrap_or_default();
        let is_agent = command
            .first()
            .and_then(|c| Path::new(c).file_name())
            .is_some_and(|n| n == "devctl-agent");
        if !is_agent {
            return Err(format!(
                "container {:?} runs {command:?}, not devctl-agent: not started (the runner \
                 only runs devctl-agent)",
                container.name
            ));
        }
        let (engine, _) = image_name_and_tag(container.image.as_deref().unwrap_or_default());
        let run_as = RunAs::for_engine(&engine)?;
        Ok(Self {
            volumes: spec.volumes.clone().unwrap_or_default(),
            service_account: spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
            container,
            engine,
            run_as,
        })
    }

    /// The init containers to run first, in order, each as a plan of its own: those that run
    /// `devctl-agent` other than `install` (the runner provides the agent binary itself);
    /// any other init container is not run (said in the pod's log).
    pub(super) fn init_containers(pod: &Pod, main: &Plan) -> (Vec<Plan>, Vec<String>) {
        let mut plans = Vec::new();
        let mut skipped = Vec::new();
        let inits = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.clone())
            .unwrap_or_default();
        for init in inits {
            let command = init.command.clone().unwrap_or_default();
            let is_agent = command
                .first()
                .and_then(|c| Path::new(c).file_name())
                .is_some_and(|n| n == "devctl-agent");
            let first_arg = command
                .get(1)
                .or_else(|| init.args.as_ref().and_then(|a| a.first()))
                .cloned()
                .unwrap_or_default();
            if is_agent && first_arg == "install" {
                continue;
            }
            if !is_agent {
                skipped.push(init.name.clone());
                continue;
            }
            plans.push(Plan {
                container: init,
                ..main.clone()
            });
        }
        (plans, skipped)
    }

    /// `(volume name, claim name)` of each claim volume.
    pub(super) fn claims(&self) -> Vec<(String, String)> {
        self.volumes
            .iter()
            .filter_map(|v| {
                let claim = v.persistent_volume_claim.as_ref()?;
                Some((v.name.clone(), claim.claim_name.clone()))
            })
            .collect()
    }
}

/// The user an agent runs as.
#[derive(Clone, Debug)]
pub(super) struct RunAs {
    pub(super) user: String,
    pub(super) uid: u32,
    pub(super) gid: u32,
    /// Running as root: switch to `uid`/`gid` and chown what it writes.
    pub(super) switch: bool,
}

impl RunAs {
    fn for_engine(engine: &str) -> Result<Self, String> {
        // SAFETY: geteuid/getegid cannot fail.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid != 0 {
            return Ok(Self {
                user: std::env::var("USER").unwrap_or_else(|_| euid.to_string()),
                uid: euid,
                gid: egid,
                switch: false,
            });
        }
        let user = match engine {
            "postgres" => "postgres",
            "mysql" | "mariadb" => "mysql",
            other => {
                return Err(format!(
                    "image {other:?}: no user to run it as (postgres:* and mysql:* images only)"
                ));
            }
        };
        let (uid, gid) = lookup_user(user).ok_or_else(|| {
            format!("user {user:?} does not exist on this machine: install the engine's package")
        })?;
        Ok(Self {
            user: user.into(),
            uid,
            gid,
            switch: true,
        })
    }

    pub(super) fn owner(&self) -> Option<(u32, u32)> {
        self.switch.then_some((self.uid, self.gid))
    }
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    // SAFETY: getpwnam_r writes into `entry` and `buffer`, which outlive the call; `result`
    // points to `entry` or is null.
    unsafe {
        let mut entry: libc::passwd = std::mem::zeroed();
        let mut buffer = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        );
        (rc == 0 && !result.is_null()).then_some((entry.pw_uid, entry.pw_gid))
    }
}

/// `registry/library/postgres:16.4@sha256:…` → (`postgres`, `Some("16.4")`).
pub(super) fn image_name_and_tag(image: &str) -> (String, Option<String>) {
    let image = image.split('@').next().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or_default();
    match last.split_once(':') {
        Some((name, tag)) => (name.to_string(), Some(tag.to_string())),
        None => (last.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_image_names_and_tags() {
        assert_eq!(
            image_name_and_tag("docker.io/library/postgres:16.4@sha256:ab"),
            ("postgres".into(), Some("16.4".into()))
        );
        assert_eq!(image_name_and_tag("mysql"), ("mysql".into(), None));
        assert_eq!(
            image_name_and_tag("localhost:5000/mysql:8.4"),
            ("mysql".into(), Some("8.4".into()))
        );
    }
}
