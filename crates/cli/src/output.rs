//! Printing data as a table (kubectl-like), JSON or YAML.

use clap::ValueEnum;
use serde::Serialize;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Yaml,
}

/// Prints `value` as JSON or YAML; returns false for `Table` (the caller prints a table).
pub fn structured<T: Serialize>(format: Format, value: &T) -> anyhow::Result<bool> {
    match format {
        Format::Table => Ok(false),
        Format::Json => {
            println!("{}", serde_json::to_string_pretty(value)?);
            Ok(true)
        }
        Format::Yaml => {
            print!("{}", devctl_api::to_yaml(value)?);
            Ok(true)
        }
    }
}

/// Prints rows as left-aligned columns separated by three spaces, like kubectl.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// `5m`, `3h`, `2d` since `time`, like kubectl's AGE column.
pub fn age(time: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> String {
    let Some(time) = time else {
        return "<unknown>".into();
    };
    let seconds = (k8s_openapi::jiff::Timestamp::now().as_second() - time.0.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The conditions of a status as an indented table.
pub fn conditions(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) {
    println!("\nConditions:");
    let rows: Vec<Vec<String>> = conditions
        .iter()
        .map(|c| {
            vec![
                format!("  {}", c.type_),
                c.status.clone(),
                c.reason.clone(),
                c.message.clone(),
            ]
        })
        .collect();
    table(&["  TYPE", "STATUS", "REASON", "MESSAGE"], &rows);
}
