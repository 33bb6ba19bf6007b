//! Coalescing bursts of child events into one reconcile of their owner.
//!
//! Creating a cluster makes its children change many times within a second or so (the pod
//! is scheduled, starts, turns ready; the StatefulSet counts it; the claim binds), each
//! change a watch event that names the owner. Reconciling after each one costs a reconcile
//! and often a status write for a state that is already outdated. [`debounce`] releases an
//! owner once its children have been quiet for a moment, so a burst becomes one reconcile
//! that sees where it ended, and an isolated event still gets through after that moment
//! only. A steady trickle cannot hold an owner back for long: it is released at the latest
//! [`LONGEST_HOLD_FACTOR`] quiet periods after its first event.

use std::collections::HashMap;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

/// How many quiet periods an owner is held at most after its first event.
pub const LONGEST_HOLD_FACTOR: u32 = 4;

/// `items`, each released once no equal item arrived for `quiet`, and at the latest
/// `quiet × LONGEST_HOLD_FACTOR` after the first of them; equal items that arrive while one
/// is held are released with it, as one. A zero `quiet` passes every item on at once.
pub fn debounce<T>(items: BoxStream<'static, T>, quiet: Duration) -> BoxStream<'static, T>
where
    T: Eq + Hash + Clone + Unpin + Send + 'static,
{
    if quiet.is_zero() {
        return items;
    }
    Debounce {
        items: Some(items),
        held: DelayQueue::new(),
        keys: HashMap::new(),
        quiet,
        longest: quiet * LONGEST_HOLD_FACTOR,
    }
    .boxed()
}

struct Debounce<T> {
    /// `None` once the input ended.
    items: Option<BoxStream<'static, T>>,
    held: DelayQueue<T>,
    /// Each held item's entry in `held` and when its first copy arrived.
    keys: HashMap<T, (delay_queue::Key, Instant)>,
    quiet: Duration,
    longest: Duration,
}

impl<T: Eq + Hash + Clone + Unpin> Stream for Debounce<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        while let Some(items) = this.items.as_mut() {
            match items.poll_next_unpin(cx) {
                Poll::Ready(Some(item)) => {
                    let now = Instant::now();
                    match this.keys.get(&item) {
                        Some(&(key, first)) => {
                            let due = (now + this.quiet).min(first + this.longest);
                            this.held.reset_at(&key, due);
                        }
                        None => {
                            let key = this.held.insert_at(item.clone(), now + this.quiet);
                            this.keys.insert(item, (key, now));
                        }
                    }
                }
                Poll::Ready(None) => this.items = None,
                Poll::Pending => break,
            }
        }
        match this.held.poll_expired(cx) {
            Poll::Ready(Some(expired)) => {
                let item = expired.into_inner();
                this.keys.remove(&item);
                Poll::Ready(Some(item))
            }
            // Nothing held: the input's waker brings the next item.
            Poll::Ready(None) if this.items.is_some() => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;

    const QUIET: Duration = Duration::from_millis(200);

    /// The next released item and how long after `since` it came.
    async fn next(
        out: &mut BoxStream<'static, &'static str>,
        since: Instant,
    ) -> (&'static str, Duration) {
        let item = out.next().await.expect("an item");
        (item, since.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_released_once_after_it_went_quiet() {
        let (tx, rx) = mpsc::unbounded();
        let mut out = debounce(rx.boxed(), QUIET);
        let start = Instant::now();
        tokio::spawn(async move {
            for _ in 0..3 {
                tx.unbounded_send("a").unwrap();
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            tx.unbounded_send("b").unwrap();
        });
        // "a": last event at 300 ms, released 200 ms later; "b" came at 450 ms.
        assert_eq!(
            next(&mut out, start).await,
            ("a", Duration::from_millis(500))
        );
        assert_eq!(
            next(&mut out, start).await,
            ("b", Duration::from_millis(650))
        );
        assert_eq!(
            out.next().await,
            None,
            "the input ended and nothing is held"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_trickle_is_released_after_the_longest_hold() {
        let (tx, rx) = mpsc::unbounded();
        let mut out = debounce(rx.boxed(), QUIET);
        let start = Instant::now();
        let sender = tokio::spawn(async move {
            for _ in 0..20 {
                tx.unbounded_send("a").unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let longest = QUIET * LONGEST_HOLD_FACTOR;
        assert_eq!(next(&mut out, start).await, ("a", longest));
        // The trickle goes on: held again from its next event.
        let (item, at) = next(&mut out, start).await;
        assert_eq!(item, "a");
        assert!(at <= longest * 2 + Duration::from_millis(100), "{at:?}");
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn zero_quiet_passes_items_on_at_once() {
        let (tx, rx) = mpsc::unbounded();
        let mut out = debounce(rx.boxed(), Duration::ZERO);
        let start = Instant::now();
        tx.unbounded_send("a").unwrap();
        tx.unbounded_send("a").unwrap();
        assert_eq!(next(&mut out, start).await, ("a", Duration::ZERO));
        assert_eq!(next(&mut out, start).await, ("a", Duration::ZERO));
    }
}
