//! The campaign's prober: every instance asked ten times a second, over a session of its own
//! ([`WriteProbe`]), whether it acknowledges a commit. An instance's address is read from its
//! agent's report once a second, and a new session opened when it moves (a replaced pod).

use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::checks::ProbeSamples;
use crate::workload::{Access, WriteProbe, reported_address};

/// How often each instance is asked.
pub const PROBE_EVERY: Duration = Duration::from_millis(100);
/// How often an instance's address is read again.
const ADDRESS_EVERY: Duration = Duration::from_secs(1);

/// One instance's prober task: its samples when it ends.
type ProbeTask = tokio::task::JoinHandle<Vec<(Duration, bool)>>;

pub struct Prober {
    stop: watch::Sender<bool>,
    tasks: Vec<(String, ProbeTask)>,
}

impl Prober {
    /// Probes `pods` (names that may not exist yet: they count as not writable) from now;
    /// sample times are measured from `started`.
    pub fn start(
        client: &kube::Client,
        namespace: &str,
        pods: &[String],
        access: Access,
        started: Instant,
    ) -> Self {
        let (stop, stopped) = watch::channel(false);
        let tasks = pods
            .iter()
            .map(|pod| {
                let task = tokio::spawn(probe_one(
                    client.clone(),
                    namespace.to_string(),
                    pod.clone(),
                    access.clone(),
                    started,
                    stopped.clone(),
                ));
                (pod.clone(), task)
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stops probing; every instance's samples.
    pub async fn finish(self) -> Vec<ProbeSamples> {
        let _ = self.stop.send(true);
        let mut probes = Vec::new();
        for (pod, task) in self.tasks {
            probes.push(ProbeSamples {
                pod,
                samples: task.await.unwrap_or_default(),
            });
        }
        probes
    }
}

async fn probe_one(
    client: kube::Client,
    namespace: String,
    pod: String,
    access: Access,
    started: Instant,
    stopped: watch::Receiver<bool>,
) -> Vec<(Duration, bool)> {
    let mut samples = Vec::new();
    let mut probe: Option<(WriteProbe, (String, String))> = None;
    let mut looked: Option<Instant> = None;
    while !*stopped.borrow() {
        let at = Instant::now();
        if looked.is_none_or(|l| at.duration_since(l) >= ADDRESS_EVERY) {
            looked = Some(at);
            // The API server may be away: keep probing the last address meanwhile.
            if let Some(address) = reported_address(&client, &namespace, &pod).await
                && probe.as_ref().is_none_or(|(_, known)| *known != address)
            {
                // Each instance's probe writes a row of its own (MariaDB).
                let row = pod
                    .rsplit_once('-')
                    .and_then(|(_, n)| n.parse().ok())
                    .unwrap_or(0);
                probe = Some((WriteProbe::with(access.clone(), row, &address), address));
            }
        }
        // The time the probe is sent: a commit it saw acknowledged happened after it.
        let sent = Instant::now();
        let writable = match probe.as_mut() {
            Some((probe, _)) => probe.writable().await,
            None => false,
        };
        samples.push((sent.saturating_duration_since(started), writable));
        tokio::time::sleep_until((at + PROBE_EVERY).into()).await;
    }
    samples
}
