//! Durations as people type them on command lines: Go's `time.ParseDuration` forms, which
//! kubectl, helm and controller-runtime flags take (`15s`, `1500ms`, `7.5s`, `1m30s`, `2h`),
//! plus days (`90d`) and a bare number of seconds (`7`). One reader for the operator's flags
//! and the CLI's `--timeout`, so both accept the same values.
//!
//! The spec's durations are stricter (see [`crate::database_cluster::parse_duration`]): the
//! CRD schema admits only hours, minutes and seconds there, and that reader matches it.

use std::time::Duration;

/// Parses a duration as Go's `time.ParseDuration` writes them — `15s`, `1500ms`, `7.5s`,
/// `1m30s`, `2h` — plus days (`90d`) and a plain number of seconds (`7`).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid =
        || format!("{text:?} is not a duration such as 15s, 1500ms, 7.5s, 1m30s, 2h or 90d");
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| invalid());
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return Err(invalid()),
        };
        total += value * seconds;
        rest = after;
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_controller_runtime_flags() {
        assert_eq!(parse("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("90d"), Ok(Duration::from_secs(90 * 86400)));
        assert_eq!(parse("7.5s"), Ok(Duration::from_millis(7500)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h0m2.5s"), Ok(Duration::from_millis(3_602_500)));
        assert!(parse("7w").is_err());
        assert!(parse("").is_err());
        assert!(parse("1.2.3s").is_err());
        assert!(parse("5s3").is_err());
        assert!(parse("s").is_err());
    }
}
