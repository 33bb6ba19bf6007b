//! Just enough of Kubernetes quantities to size volumes and tune database memory.

/// Bytes in a memory or storage quantity (`512Mi`, `1Gi`, `2G`, `1.5Gi`, `1048576`), or
/// `None` if it is not one.
pub fn to_bytes(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let value: f64 = number.parse().ok()?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "m" => 1e-3,
        _ => return None,
    };
    let bytes = value * factor;
    (bytes.is_finite() && bytes >= 0.0).then_some(bytes as u64)
}

/// Millicores in a CPU quantity (`250m`, `2`, `1.5`), or `None`.
pub fn to_millicores(quantity: &str) -> Option<u64> {
    let q = quantity.trim();
    if let Some(milli) = q.strip_suffix('m') {
        return milli.parse().ok();
    }
    let cores: f64 = q.parse().ok()?;
    (cores.is_finite() && cores >= 0.0).then_some((cores * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_suffixes() {
        assert_eq!(to_bytes("512Mi"), Some(512 * 1024 * 1024));
        assert_eq!(to_bytes("1.5Gi"), Some(1536 * 1024 * 1024));
        assert_eq!(to_bytes("2G"), Some(2_000_000_000));
        assert_eq!(to_bytes("100"), Some(100));
        assert_eq!(to_bytes("10GB"), None);
        assert_eq!(to_millicores("250m"), Some(250));
        assert_eq!(to_millicores("2"), Some(2000));
        assert_eq!(to_millicores("0.5"), Some(500));
    }
}
