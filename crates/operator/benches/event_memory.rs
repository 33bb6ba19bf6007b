//! What a recorder keeps in memory per published event: `cargo bench -p devctl-operator
//! --bench event_memory -- [events]` publishes one event about each of N objects (as N new
//! clusters' `Applied` events do) through kube-runtime's `Recorder` and through devctl's
//! (`event_recorder`), on the local control plane, and prints the heap each one still holds
//! afterwards, counted by a global allocator that tracks live bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::core::v1::ObjectReference;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only the live byte
// count is kept beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// A reference like the operator's `object_ref` of a DatabaseCluster.
fn cluster_ref(namespace: &str, i: usize) -> ObjectReference {
    ObjectReference {
        api_version: Some("db.devctl.io/v1beta1".into()),
        kind: Some("DatabaseCluster".into()),
        name: Some(format!("bench-{i:04}")),
        namespace: Some(namespace.into()),
        resource_version: Some(format!("{}", 100_000 + i)),
        uid: Some(format!("0b7d3c1e-5f0a-4c6e-9d2b-{i:012}")),
        field_path: None,
    }
}

/// An `Applied` event as a new cluster's first reconcile publishes it.
fn applied() -> kube::runtime::events::Event {
    let summary = "created ConfigMap bench-config, Secret bench-credentials, Service bench-rw, \
                   Service bench-ro, Service bench-headless, ServiceAccount bench, Role bench, \
                   RoleBinding bench, PodDisruptionBudget bench, StatefulSet bench";
    kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "Applied".into(),
        note: Some(summary.into()),
        action: summary.chars().take(128).collect(),
        secondary: None,
    }
}

fn reporter() -> kube::runtime::events::Reporter {
    kube::runtime::events::Reporter {
        controller: "devctl-operator".into(),
        instance: Some("devctl-operator-5d8f7b9c4-x2x7k".into()),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let events: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    let cluster = devctl_testenv::shared_control_plane().await?;
    let client = cluster.client().await?;
    let event = applied();
    let mut rows = Vec::new();
    for which in ["kube-runtime Recorder", "devctl event_recorder"] {
        let namespace = cluster.create_namespace("events").await?;
        let references: Vec<ObjectReference> =
            (0..events).map(|i| cluster_ref(&namespace, i)).collect();
        // Warm the client (connection, TLS) before counting.
        let warm = cluster_ref(&namespace, events);
        // The two recorders share no trait: the same steps, written once.
        macro_rules! heap_held_by {
            ($recorder:expr) => {{
                let recorder = $recorder;
                recorder.publish(&event, &warm).await?;
                let before = live();
                for reference in &references {
                    recorder.publish(&event, reference).await?;
                }
                live() - before
            }};
        }
        let started = std::time::Instant::now();
        let held = if which.starts_with("kube") {
            heap_held_by!(kube::runtime::events::Recorder::new(
                client.clone(),
                reporter()
            ))
        } else {
            heap_held_by!(devctl_operator::event_recorder::Recorder::new(
                client.clone(),
                reporter()
            ))
        };
        rows.push((which, held, started.elapsed()));
    }
    println!("| {events} events, one per object | heap held after | per event | time to publish |");
    println!("|---|---:|---:|---:|");
    for (which, held, took) in rows {
        println!(
            "| {which} | {:.2} MiB | {} B | {:.2} s |",
            held as f64 / 1024.0 / 1024.0,
            held / events as isize,
            took.as_secs_f64()
        );
    }
    Ok(())
}
