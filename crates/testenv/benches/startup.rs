//! Startup time of `ControlPlane` and `Cluster` with warm binaries.
//!
//! `cargo bench -p devctl-testenv --bench startup [-- <runs>]` prints min / median / max for
//! each mode: from `start()` until the API server answers `/readyz` (ControlPlane), and until
//! every simulated node is Ready (Cluster). Results are recorded in docs/testenv.md.

use std::time::{Duration, Instant};

use devctl_testenv::{Cluster, ControlPlane};

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "{label:<13} runs={} min={} ms median={} ms max={} ms",
        samples.len(),
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    );
}

#[tokio::main]
async fn main() -> Result<(), devctl_testenv::Error> {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    // Build (or find) the binaries outside the measurement.
    tokio::task::spawn_blocking(devctl_testenv::binaries::Binaries::ensure)
        .await
        .map_err(|e| devctl_testenv::Error::Process(e.to_string()))??;

    let mut control_plane = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let cp = ControlPlane::start().await?;
        control_plane.push(start.elapsed());
        drop(cp);
    }
    summary("ControlPlane", control_plane);

    let mut cluster = Vec::new();
    for _ in 0..runs {
        let start = Instant::now();
        let c = Cluster::start().await?;
        cluster.push(start.elapsed());
        drop(c);
    }
    summary("Cluster", cluster);
    Ok(())
}
