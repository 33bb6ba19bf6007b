//! MariaDB GTID positions (`gtid_current_pos`, `gtid_binlog_pos`): per replication domain the
//! last transaction applied, `domain-server-sequence` joined by commas (`0-1-100,1-2-7`).
//! Within a domain sequence numbers only grow, so positions compare domain by domain: what
//! the failover election ranks by, and how a returning former primary's extra transactions
//! (errant: GTIDs the new primary lacks) are found.

use std::collections::BTreeMap;

/// One domain's last GTID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub sequence: u64,
}

impl std::fmt::Display for Gtid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.sequence)
    }
}

/// A GTID position: per domain the last GTID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position(BTreeMap<u32, Gtid>);

impl std::str::FromStr for Position {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let mut domains = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let mut fields = part.splitn(3, '-');
            let mut next = || fields.next().map(str::trim);
            let invalid = || format!("GTID {part:?} is not domain-server-sequence");
            let gtid = Gtid {
                domain: next().and_then(|f| f.parse().ok()).ok_or_else(invalid)?,
                server: next().and_then(|f| f.parse().ok()).ok_or_else(invalid)?,
                sequence: next().and_then(|f| f.parse().ok()).ok_or_else(invalid)?,
            };
            if domains.insert(gtid.domain, gtid).is_some() {
                return Err(format!(
                    "GTID position {text:?} names domain {} twice",
                    gtid.domain
                ));
            }
        }
        Ok(Self(domains))
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.values().map(Gtid::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl Position {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first domain's GTID.
    pub fn first(&self) -> Option<Gtid> {
        self.0.values().next().copied()
    }

    /// The sequence number reached in `domain` (0 when the domain has none).
    pub fn sequence(&self, domain: u32) -> u64 {
        self.0.get(&domain).map_or(0, |g| g.sequence)
    }

    /// Whether every transaction of `other` is in this position (domain by domain).
    pub fn contains(&self, other: &Position) -> bool {
        other
            .0
            .values()
            .all(|g| self.sequence(g.domain) >= g.sequence)
    }

    /// The transactions of this position that `primary` lacks, one range per domain
    /// (`0-1-101..0-1-105`), or `None` when it has them all.
    pub fn errant_against(&self, primary: &Position) -> Option<String> {
        let ranges: Vec<String> = self
            .0
            .values()
            .filter(|g| g.sequence > primary.sequence(g.domain))
            .map(|g| {
                let first = primary.sequence(g.domain) + 1;
                if first == g.sequence {
                    g.to_string()
                } else {
                    format!("{}-{}-{first}..{g}", g.domain, g.server)
                }
            })
            .collect();
        (!ranges.is_empty()).then(|| ranges.join(", "))
    }

    /// A number that orders positions of one replication stream: the sum of the domains'
    /// sequence numbers. Where one position contains another it is at least as large; with
    /// one domain (devctl's) it is that domain's sequence number.
    pub fn rank(&self) -> u64 {
        self.0
            .values()
            .map(|g| g.sequence)
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(text: &str) -> Position {
        text.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_positions() {
        assert_eq!(pos("0-1-100,1-2-7").to_string(), "0-1-100,1-2-7");
        assert_eq!(pos(" 1-2-7 , 0-1-100 ").to_string(), "0-1-100,1-2-7");
        assert!(pos("").is_empty());
        for invalid in ["0-1", "a-1-2", "0-1-2-3x", "0-1-5,0-2-6", "-1-1"] {
            assert!(invalid.parse::<Position>().is_err(), "{invalid}");
        }
    }

    #[test]
    fn containment_is_domain_by_domain() {
        assert!(pos("0-1-100").contains(&pos("0-1-99")));
        assert!(pos("0-2-100").contains(&pos("0-1-100")));
        assert!(!pos("0-1-99").contains(&pos("0-1-100")));
        assert!(!pos("0-1-100").contains(&pos("0-1-100,1-1-1")));
        assert!(pos("0-1-1").contains(&pos("")));
        assert!(pos("0-1-100,1-1-5").rank() > pos("0-1-100").rank());
    }

    #[test]
    fn errant_transactions_are_the_ones_the_primary_lacks() {
        assert_eq!(pos("0-1-100").errant_against(&pos("0-2-100")), None);
        assert_eq!(pos("0-1-100").errant_against(&pos("0-2-120")), None);
        assert_eq!(
            pos("0-1-105").errant_against(&pos("0-2-100")).as_deref(),
            Some("0-1-101..0-1-105")
        );
        assert_eq!(
            pos("0-1-101").errant_against(&pos("0-2-100")).as_deref(),
            Some("0-1-101")
        );
        assert_eq!(
            pos("0-1-3,1-1-2").errant_against(&pos("0-2-3")).as_deref(),
            Some("1-1-1..1-1-2")
        );
    }
}
