//! Waiting with progress: watch an object until a condition holds or a timeout passes,
//! printing each new state on stderr.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// Watches `name` until `done` returns `Ok(true)`; `describe` gives the progress line printed
/// whenever it changes. On timeout the error carries the last progress line.
pub async fn until<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    describe: impl Fn(Option<&K>) -> String,
    done: impl Fn(Option<&K>) -> bool,
) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut last = String::new();
    let stream = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff();
    let wait = async {
        let mut stream = std::pin::pin!(stream);
        let mut current: Option<K> = None;
        let mut listed = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(obj)) | Ok(watcher::Event::InitApply(obj)) => {
                    current = Some(obj)
                }
                Ok(watcher::Event::Delete(_)) => current = None,
                Ok(watcher::Event::InitDone) => listed = true,
                Ok(watcher::Event::Init) => current = None,
                Err(error) => tracing::debug!(%error, "watch error; retrying"),
            }
            if !listed {
                continue;
            }
            let line = describe(current.as_ref());
            if line != last {
                eprintln!("  {line}");
                last = line;
            }
            if done(current.as_ref()) {
                return true;
            }
        }
        false
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(true) => Ok(()),
        Ok(false) => anyhow::bail!("the watch of {name} ended unexpectedly"),
        Err(_) => {
            let state = if last.is_empty() {
                "no state observed".to_string()
            } else {
                last
            };
            anyhow::bail!(
                "timed out after {}s waiting for {name}: {state}",
                timeout.as_secs()
            )
        }
    }
}

/// Waits until `name` no longer exists (finalizers done).
pub async fn until_deleted<K>(api: &Api<K>, name: &str, timeout: Duration) -> anyhow::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    until(
        api,
        name,
        timeout,
        |o| {
            if o.is_some() {
                "being deleted".into()
            } else {
                "gone".into()
            }
        },
        |o| o.is_none(),
    )
    .await
}

/// Parses a `--timeout` value the way kubectl and helm take one — `90s`, `5m`, `1h`, `1m30s`
/// — and, as earlier releases of devctl did, a bare number of seconds (`120`). The operator's
/// duration flags read the same forms ([`devctl_api::duration::parse`]).
pub fn parse_timeout(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let duration = devctl_api::duration::parse(value)
        .map_err(|_| format!("{value:?} is not a duration; use e.g. 90s, 5m, 1h or 1m30s"))?;
    // A deadline is computed from it: keep it far below what an instant can hold.
    if duration > MAX_TIMEOUT {
        return Err(format!("{value} is longer than the maximum, 365d"));
    }
    Ok(duration)
}

const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_durations_or_seconds() {
        assert_eq!(parse_timeout("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("120s"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        let error = parse_timeout("soon").unwrap_err();
        assert!(error.contains("use e.g. 90s"), "{error}");
        assert!(parse_timeout("").is_err());
        assert!(parse_timeout("-5s").is_err());
        assert!(parse_timeout("99999999999999999999").is_err());
        assert!(parse_timeout("1000000h").unwrap_err().contains("maximum"));
    }
}
