//! "Does the live child still hold what we applied?" — the content check behind
//! [`super::Applier::sync`], used only when a child's `resourceVersion` is not the one our
//! last apply returned.
//!
//! Every field of the desired body must be in the live object with an equal value. What
//! the API server defaults, and what other managers add (a sidecar an admission webhook
//! injects, a second owner reference, another label), is theirs and does not count:
//! - lists of objects match element by element wherever the live element is (so foreign
//!   elements around ours are fine); lists of scalars must be equal;
//! - resource quantities compare by value (`0.5` is stored as `500m`);
//! - zero values the server drops for `omitempty` fields match their absence.

use serde_json::Value;

/// The path of the first desired field the live object does not hold, or `None` when the
/// live object holds every desired field. The path names fields only, never values (the
/// values of a Secret must not reach a log).
pub fn drifted(desired: &Value, live: &Value) -> Option<String> {
    difference(desired, live, "")
}

fn difference(desired: &Value, live: &Value, path: &str) -> Option<String> {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().find_map(|(key, dv)| {
            let here = format!("{path}.{key}");
            match l.get(key) {
                Some(lv) => difference(dv, lv, &here),
                None if is_empty(dv) => None,
                None => Some(here),
            }
        }),
        (Value::Array(d), Value::Array(l)) if d.iter().any(Value::is_object) => {
            d.iter().enumerate().find_map(|(i, dv)| {
                let matched = l.iter().any(|lv| difference(dv, lv, "").is_none());
                (!matched).then(|| format!("{path}[{}]", element_name(dv, i)))
            })
        }
        (Value::Array(d), Value::Null) if d.is_empty() => None,
        (Value::Number(d), Value::Number(l)) => (d.as_f64() != l.as_f64()).then(|| path.into()),
        (Value::String(d), Value::String(l)) if d != l => {
            let quantity = is_quantity_path(path)
                && parse_quantity(d).is_some_and(|d| Some(d) == parse_quantity(l));
            (!quantity).then(|| path.into())
        }
        (Value::Null, _) => None,
        _ if desired == live => None,
        _ => Some(path.into()),
    }
}

/// `name=x` for list elements with a name (containers, env, ports), else the index.
fn element_name(element: &Value, index: usize) -> String {
    match element.get("name").and_then(Value::as_str) {
        Some(name) => format!("name={name}"),
        None => index.to_string(),
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

/// Fields that hold resource.Quantity values in the children devctl renders.
fn is_quantity_path(path: &str) -> bool {
    let mut segments = path.rsplit('.');
    let last = segments.next().unwrap_or_default();
    let parent = segments.next().unwrap_or_default();
    matches!(parent, "requests" | "limits" | "capacity") || last == "sizeLimit"
}

/// A Kubernetes quantity as an exact integer (see [`normalise`]), so two spellings of one
/// value compare equal.
fn parse_quantity(text: &str) -> Option<i128> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (pow10, pow2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => (s[1..].parse().ok()?, 0),
        _ => return None,
    };
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let mantissa: i128 = format!("{whole}{fraction}").parse().ok()?;
    let pow10 = pow10 - i32::try_from(fraction.len()).ok()?;
    normalise(mantissa, pow10, pow2).map(|v| if negative { -v } else { v })
}

/// The value in units of 10⁻⁹ (Kubernetes keeps no finer precision).
fn normalise(mantissa: i128, pow10: i32, pow2: u32) -> Option<i128> {
    let scaled = mantissa.checked_mul(1i128.checked_shl(pow2)?)?;
    let exponent = pow10 + 9;
    if exponent >= 0 {
        scaled.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)
    } else {
        Some(scaled / 10i128.checked_pow(u32::try_from(-exponent).ok()?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_added_by_the_server_do_not_matter() {
        let desired = json!({"spec": {"replicas": 3, "ports": [{"port": 5432}]}});
        let live = json!({"spec": {"replicas": 3, "ports": [{"port": 5432, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}});
        assert_eq!(drifted(&desired, &live), None);
    }

    #[test]
    fn drift_is_found_and_named_by_path_without_values() {
        let desired = json!({"spec": {"replicas": 3}});
        assert_eq!(
            drifted(&desired, &json!({"spec": {"replicas": 0}})).as_deref(),
            Some(".spec.replicas")
        );
        assert_eq!(
            drifted(&desired, &json!({"spec": {}})).as_deref(),
            Some(".spec.replicas")
        );
        let secret = json!({"data": {"password": "c2VjcmV0"}});
        let changed = drifted(&secret, &json!({"data": {"password": "b3RoZXI="}})).unwrap();
        assert_eq!(changed, ".data.password");
        assert!(drifted(&json!({"a": {}}), &json!({})).is_none());
        assert!(
            drifted(&json!({"delay": 0, "flag": false}), &json!({})).is_none(),
            "omitempty zero values"
        );
        assert!(drifted(&json!({"delay": 5}), &json!({})).is_some());
    }

    #[test]
    fn quantities_compare_by_value() {
        let desired = json!({"resources": {"requests": {"cpu": "0.5", "memory": "1Gi"}}});
        let live = json!({"resources": {"requests": {"cpu": "500m", "memory": "1073741824"}}});
        assert_eq!(drifted(&desired, &live), None);
        let other = json!({"resources": {"requests": {"cpu": "600m", "memory": "1Gi"}}});
        assert!(drifted(&desired, &other).is_some());
        assert_eq!(parse_quantity("1e3"), parse_quantity("1k"));
        assert_eq!(parse_quantity("2.5Gi"), parse_quantity("2560Mi"));
        assert_eq!(parse_quantity("bogus"), None);
        // Only quantity fields: a label "16.20" is not "16.2".
        assert!(
            drifted(
                &json!({"labels": {"v": "16.2"}}),
                &json!({"labels": {"v": "16.20"}})
            )
            .is_some()
        );
    }

    #[test]
    fn elements_other_managers_add_to_lists_are_theirs() {
        let desired = json!({"containers": [{"name": "postgres", "image": "postgres:16.2"}]});
        let with_sidecar = json!({"containers": [
            {"name": "istio-proxy", "image": "proxy"},
            {"name": "postgres", "image": "postgres:16.2", "imagePullPolicy": "IfNotPresent"}
        ]});
        assert_eq!(drifted(&desired, &with_sidecar), None);
        let changed = json!({"containers": [{"name": "postgres", "image": "postgres:15"}]});
        assert_eq!(
            drifted(&desired, &changed).as_deref(),
            Some(".containers[name=postgres]")
        );
        let owners = json!({"ownerReferences": [{"uid": "a", "controller": true}]});
        let two_owners =
            json!({"ownerReferences": [{"uid": "b"}, {"uid": "a", "controller": true}]});
        assert_eq!(drifted(&owners, &two_owners), None);
    }

    #[test]
    fn lists_of_scalars_must_be_equal() {
        let desired = json!({"args": ["-c", "config_file=/etc/pg.conf"]});
        assert_eq!(drifted(&desired, &desired.clone()), None);
        assert!(drifted(&desired, &json!({"args": ["-c"]})).is_some());
        assert!(
            drifted(
                &desired,
                &json!({"args": ["config_file=/etc/pg.conf", "-c"]})
            )
            .is_some()
        );
    }
}
