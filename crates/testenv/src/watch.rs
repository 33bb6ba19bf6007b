//! Waiting for a state that may not last.
//!
//! `await_condition` and a poll start looking when they are called. A state the system moves
//! past on its own within a second or two (a condition set during one failover step, a
//! report before a restart) may have come and gone by then on a loaded machine, and the test
//! times out although the system did what it should. [`Since`] reads the object's
//! `resourceVersion` *before* the action that causes the state, then watches every version
//! after it, in order: the state is seen however briefly it stood.

use std::time::Duration;

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;

use crate::Error;

/// How long one watch request lasts before the server ends it and the wait goes on from the
/// last version it saw.
const WATCH_SECONDS: u32 = 60;

/// One object's version, read before an action whose effect a test waits for.
pub struct Since<K> {
    api: Api<K>,
    name: String,
    version: String,
}

impl<K> Since<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    /// Reads `name`'s current version. Call it before the action.
    pub async fn now(api: &Api<K>, name: &str) -> Result<Self, Error> {
        Ok(Self::after(api, &api.get(name).await?))
    }

    /// The version of `object`, already read (e.g. to check it first).
    pub fn after(api: &Api<K>, object: &K) -> Self {
        Self {
            api: api.clone(),
            name: object.meta().name.clone().unwrap_or_default(),
            version: object.meta().resource_version.clone().unwrap_or_default(),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first version after the one [`Since::now`] read that satisfies `check`. Every
    /// version is looked at, in order; `what` names the awaited state in the timeout error.
    pub async fn until(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&K) -> bool,
    ) -> Result<K, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.name))
            .timeout(WATCH_SECONDS);
        let mut version = self.version.clone();
        loop {
            let mut events = self.api.watch(&params, &version).await?.boxed();
            loop {
                let event = tokio::time::timeout_at(deadline, events.next())
                    .await
                    .map_err(|_| Error::Timeout {
                        what: format!("{what} ({})", self.name),
                        after: timeout,
                    })?;
                match event {
                    // The server ended the watch: go on from the last version seen.
                    None => break,
                    Some(Err(e)) => return Err(e.into()),
                    Some(Ok(WatchEvent::Error(status))) => {
                        return Err(kube::Error::Api(status).into());
                    }
                    Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                        if check(&object) {
                            return Ok(object);
                        }
                        version = object.meta().resource_version.clone().unwrap_or(version);
                    }
                    Some(Ok(WatchEvent::Deleted(object))) => {
                        version = object.meta().resource_version.clone().unwrap_or(version);
                    }
                    Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                        version = bookmark.metadata.resource_version;
                    }
                }
            }
        }
    }
}
