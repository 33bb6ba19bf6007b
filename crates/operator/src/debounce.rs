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
//!
//! Some owners cannot wait: while a cluster fails over or switches its primary, every step
//! waits for the reports of its pods, and each quiet period would add to the time nobody
//! can write. Their events come marked [`Urgency::Now`] and are released at once, taking
//! any held copy with them.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

/// How many quiet periods an owner is held at most after its first event.
pub const LONGEST_HOLD_FACTOR: u32 = 4;

/// Whether an item may wait for its burst to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// Coalesced with the equal items around it.
    Coalesce,
    /// Released at once, with any equal item held.
    Now,
}

/// `items`, each released once no equal item arrived for `quiet`, and at the latest
/// `quiet × LONGEST_HOLD_FACTOR` after the first of them; equal items that arrive while one
/// is held are released with it, as one. An item of [`Urgency::Now`] is released at once
/// and ends the hold of its equal. A zero `quiet` passes every item on at once.
pub fn debounce<T>(
    items: BoxStream<'static, (T, Urgency)>,
    quiet: Duration,
) -> BoxStream<'static, T>
where
    T: Eq + Hash + Clone + Unpin + Send + 'static,
{
    if quiet.is_zero() {
        return items.map(|(item, _)| item).boxed();
    }
    Debounce {
        items: Some(items),
        held: DelayQueue::new(),
        keys: HashMap::new(),
        urgent: VecDeque::new(),
        quiet,
        longest: quiet * LONGEST_HOLD_FACTOR,
    }
    .boxed()
}

struct Debounce<T> {
    /// `None` once the input ended.
    items: Option<BoxStream<'static, (T, Urgency)>>,
    held: DelayQueue<T>,
    /// Urgent items not yet taken, in arrival order.
    urgent: VecDeque<T>,
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
                Poll::Ready(Some((item, Urgency::Now))) => {
                    if let Some((key, _)) = this.keys.remove(&item) {
                        this.held.remove(&key);
                    }
                    if !this.urgent.contains(&item) {
                        this.urgent.push_back(item);
                    }
                }
                Poll::Ready(Some((item, Urgency::Coalesce))) => {
                    if this.urgent.contains(&item) {
                        // Released with the urgent copy that is still waiting to be taken.
                        continue;
                    }
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
        if let Some(item) = this.urgent.pop_front() {
            return Poll::Ready(Some(item));
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
                tx.unbounded_send(("a", Urgency::Coalesce)).unwrap();
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            tx.unbounded_send(("b", Urgency::Coalesce)).unwrap();
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
                tx.unbounded_send(("a", Urgency::Coalesce)).unwrap();
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
        tx.unbounded_send(("a", Urgency::Coalesce)).unwrap();
        tx.unbounded_send(("a", Urgency::Coalesce)).unwrap();
        assert_eq!(next(&mut out, start).await, ("a", Duration::ZERO));
        assert_eq!(next(&mut out, start).await, ("a", Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn an_urgent_item_is_released_at_once_and_ends_the_hold_of_its_equal() {
        let (tx, rx) = mpsc::unbounded();
        let mut out = debounce(rx.boxed(), QUIET);
        let start = Instant::now();
        let sender = tokio::spawn(async move {
            tx.unbounded_send(("a", Urgency::Coalesce)).unwrap();
            tx.unbounded_send(("b", Urgency::Coalesce)).unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.unbounded_send(("a", Urgency::Now)).unwrap();
            tokio::time::sleep(Duration::from_millis(500)).await;
        });
        assert_eq!(
            next(&mut out, start).await,
            ("a", Duration::from_millis(50)),
            "the urgent item does not wait"
        );
        assert_eq!(
            next(&mut out, start).await,
            ("b", QUIET),
            "the other owner is still coalesced"
        );
        sender.await.unwrap();
        assert_eq!(
            out.next().await,
            None,
            "the held copy of \"a\" went out with the urgent one"
        );
    }
}
