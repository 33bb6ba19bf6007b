//! metav1.Condition rules: one condition per type, `lastTransitionTime` changes only when
//! `status` changes, every condition carries the generation it describes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub const READY: &str = "Ready";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
/// kstatus's abnormal-true conditions (`sigs.k8s.io/cli-utils/pkg/kstatus`), read by Flux,
/// kpt and Config Sync: `Reconciling=True` while work is under way, `Stalled=True` when the
/// operator cannot make progress without a human.
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";

/// Status values.
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

/// A condition to set: type, status, reason (CamelCase) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: String,
    pub message: String,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: &'static str,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// `Reconciling` and `Stalled` from what is under way and what blocks: stalled wins (kstatus
/// reads `Reconciling=True` first, which would hide it), then the work in progress.
pub fn kstatus(in_progress: Option<(&str, &str)>, stalled: Option<(&str, &str)>) -> [Desired; 2] {
    match (stalled, in_progress) {
        (Some((reason, message)), _) => [
            Desired::new(
                RECONCILING,
                FALSE,
                "Stalled",
                "progress needs a change by a human (see Stalled)",
            ),
            Desired::new(STALLED, TRUE, reason, message),
        ],
        (None, Some((reason, message))) => [
            Desired::new(RECONCILING, TRUE, reason, message),
            Desired::new(STALLED, FALSE, "AsExpected", "nothing blocks progress"),
        ],
        (None, None) => [
            Desired::new(
                RECONCILING,
                FALSE,
                "Converged",
                "every child matches the spec",
            ),
            Desired::new(STALLED, FALSE, "AsExpected", "nothing blocks progress"),
        ],
    }
}

/// The conditions after applying `desired` to `previous`: the previous transition time is
/// kept when the status of that type did not change, otherwise it becomes `now`. Types not
/// in `desired` are kept as they were (another writer may own them).
pub fn merge(
    previous: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let mut result: Vec<Condition> = previous
        .iter()
        .filter(|c| !desired.iter().any(|d| d.type_ == c.type_))
        .cloned()
        .collect();
    for d in desired {
        let old = previous.iter().find(|c| c.type_ == d.type_);
        let last_transition_time = match old {
            Some(old) if old.status == d.status => old.last_transition_time.clone(),
            _ => now.clone(),
        };
        result.push(Condition {
            type_: d.type_.to_string(),
            status: d.status.to_string(),
            reason: d.reason.clone(),
            message: d.message.clone(),
            observed_generation: generation,
            last_transition_time,
        });
    }
    result.sort_by(|a, b| a.type_.cmp(&b.type_));
    result
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether a reason is valid for metav1.Condition (`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`).
pub fn is_valid_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let Some((&first, rest)) = bytes.split_first() else {
        return false;
    };
    first.is_ascii_alphabetic()
        && rest
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'))
        && rest
            .last()
            .is_none_or(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let first = merge(
            &[],
            &[Desired::new(READY, FALSE, "Creating", "starting")],
            Some(1),
            &at(100),
        );
        assert_eq!(first[0].last_transition_time, at(100));
        let same = merge(
            &first,
            &[Desired::new(READY, FALSE, "Scaling", "2/3 ready")],
            Some(2),
            &at(200),
        );
        assert_eq!(
            same[0].last_transition_time,
            at(100),
            "same status keeps the time"
        );
        assert_eq!(same[0].reason, "Scaling");
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(
            &same,
            &[Desired::new(READY, TRUE, "Ready", "3/3 ready")],
            Some(2),
            &at(300),
        );
        assert_eq!(flipped[0].last_transition_time, at(300));
    }

    #[test]
    fn reasons_follow_the_metav1_pattern() {
        assert!(is_valid_reason("ReconcileError"));
        assert!(is_valid_reason("A"));
        assert!(!is_valid_reason("Not valid"));
        assert!(!is_valid_reason("1Bad"));
        assert!(!is_valid_reason("Trailing,"));
    }
}
