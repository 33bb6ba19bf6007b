//! "Does the live object already contain what we would apply?" — the check that lets a
//! converged reconcile make zero write requests.
//!
//! Every field of the desired apply body must be present with an equal value in the observed
//! object; fields the API server defaulted or other managers own are ignored. Lists must have
//! the same length and match element-wise (apply bodies are rendered in a stable order).

use serde_json::Value;

pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().all(|(k, dv)| {
            o.get(k).is_some_and(|ov| is_subset(dv, ov)) || is_empty(dv) && o.get(k).is_none()
        }),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(dv, ov)| is_subset(dv, ov))
        }
        (Value::Number(d), Value::Number(o)) => d.as_f64() == o.as_f64(),
        _ => desired == observed,
    }
}

/// The path of the first desired field the observed object does not match (for logs that
/// say why a child was applied).
pub fn first_difference(desired: &Value, observed: &Value, path: &str) -> Option<String> {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d.iter().find_map(|(k, dv)| match o.get(k) {
            Some(ov) => first_difference(dv, ov, &format!("{path}.{k}")),
            None if is_empty(dv) => None,
            None => Some(format!("{path}.{k} (missing)")),
        }),
        (Value::Array(d), Value::Array(o)) if d.len() == o.len() => d
            .iter()
            .zip(o)
            .enumerate()
            .find_map(|(i, (dv, ov))| first_difference(dv, ov, &format!("{path}[{i}]"))),
        _ if is_subset(desired, observed) => None,
        _ => Some(format!("{path}: want {desired}, have {observed}")),
    }
}

/// Zero values (empty maps and lists, 0, false, "") are dropped by the API server for
/// `omitempty` fields, so their absence is a match.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Null => true,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_added_by_the_server_do_not_matter() {
        let desired = json!({"spec": {"replicas": 3, "ports": [{"port": 5432}]}});
        let observed = json!({"spec": {"replicas": 3, "ports": [{"port": 5432, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}});
        assert!(is_subset(&desired, &observed));
    }

    #[test]
    fn drift_is_detected() {
        let desired = json!({"spec": {"replicas": 3}});
        assert!(!is_subset(&desired, &json!({"spec": {"replicas": 0}})));
        assert!(!is_subset(&desired, &json!({"spec": {}})));
        let list = json!({"a": [1, 2]});
        assert!(!is_subset(&list, &json!({"a": [1]})));
        assert!(is_subset(&json!({"a": {}}), &json!({})));
        assert!(
            is_subset(&json!({"delay": 0, "flag": false}), &json!({})),
            "omitempty zero values"
        );
        assert!(!is_subset(&json!({"delay": 5}), &json!({})));
    }
}
