use super::*;

/// A replica's probe as MariaDB 10.11 printed it (`testdata/probe_replica.tsv`).
const REPLICA: &str = include_str!("testdata/probe_replica.tsv");

#[test]
fn a_replica_probe_reads_its_position_and_threads() {
    let probe = parse_probe(REPLICA).unwrap();
    assert!(probe.read_only);
    assert_eq!(probe.version, "10.11.19");
    assert_eq!(probe.gtid_current, "0-1-6");
    let replication = probe.replication.clone().unwrap();
    assert_eq!(replication.master_host, "127.0.0.1");
    assert_eq!(replication.master_port, Some(13306));
    assert!(replication.streaming() && replication.relay_applied);
    assert_eq!(replication.seconds_behind, Some(0));
    let neutral = probe.to_probe(Some("42".into()));
    assert_eq!(neutral.role, ROLE_REPLICA);
    assert!(neutral.is_streaming());
    assert_eq!(neutral.gtid_position.as_deref(), Some("0-1-6"));
    assert_eq!(neutral.lag_seconds, Some(0));
    assert_eq!(neutral.streaming_replicas, None);
}

#[test]
fn a_primary_probe_lists_its_replicas_by_report_host() {
    let out = "devctl_version\tread_only\tgtid_current\tgtid_binlog\tsemi_sync_enabled\tsemi_sync_status\n\
               10.11.19-MariaDB-log\t0\t0-1-9\t0-1-9\t1\tOFF\n\
               Server_id\tHost\tPort\tMaster_id\n\
               3\tdb-2\t3306\t1\n\
               2\tdb-1\t3306\t1\n";
    let probe = parse_probe(out).unwrap();
    let neutral = probe.to_probe(None);
    assert_eq!(neutral.role, ROLE_PRIMARY);
    assert_eq!(
        neutral.streaming_replicas,
        Some(vec!["db-1".to_string(), "db-2".to_string()])
    );
    // Semi-synchronous replication switched on but fallen back to asynchronous.
    assert_eq!(neutral.semi_sync_active, Some(false));
    assert_eq!(neutral.wal_receiver, None);
}

#[test]
fn a_probe_without_the_server_row_is_an_error() {
    assert!(parse_probe("").is_err());
    assert!(parse_probe("Server_id\tHost\tPort\tMaster_id\n").is_err());
}

#[test]
fn batch_escapes_are_undone() {
    assert_eq!(unescape(r"a\tb\nc\\d"), "a\tb\nc\\d");
}

#[test]
fn markers_round_trip() {
    for marker in [
        Marker::Cloned("0-1-5".into()),
        Marker::Rejoin,
        Marker::Replica,
    ] {
        assert_eq!(Marker::parse(&marker.render()), marker);
    }
    assert_eq!(Marker::parse("clone "), Marker::Cloned(String::new()));
    assert_eq!(Marker::parse(""), Marker::Replica);
}

#[test]
fn sql_literals_escape_quotes_and_backslashes() {
    assert_eq!(literal("a'b\\c"), "'a''b\\\\c'");
    let sql = replicate_sql("db-0", 3306, "devctl_replication", "p'w", Some("0-1-5"));
    assert!(
        sql.contains("SET GLOBAL gtid_slave_pos = '0-1-5';"),
        "{sql}"
    );
    assert!(sql.contains("MASTER_PASSWORD = 'p''w'"), "{sql}");
    assert!(sql.contains("MASTER_USE_GTID = slave_pos"), "{sql}");
    assert!(!replicate_sql("h", 1, "u", "p", None).contains("gtid_slave_pos"));
}

#[test]
fn errant_transactions_are_found_against_the_fork_point() {
    assert_eq!(errant("0-1-100", "0-1-100").unwrap(), None);
    assert_eq!(errant("0-1-99", "0-1-100").unwrap(), None);
    assert_eq!(
        errant("0-1-102", "0-1-100").unwrap().as_deref(),
        Some("0-1-101..0-1-102")
    );
    assert!(errant("x", "0-1-1").is_err());
}

#[test]
fn io_errors_tell_divergence_from_purged_binary_logs() {
    let error = |errno, text: &str| Replication {
        last_io_errno: errno,
        last_io_error: text.into(),
        ..Replication::default()
    };
    let diverged_error = error(
        1236,
        "Got fatal error 1236 from master when reading data from binary log: 'Error: connecting slave requested to start from GTID 0-1-101, which is not in the master's binlog. Since the master's binlog contains GTIDs with higher sequence numbers, it probably means that the slave has diverged due to executing extra erroneous transactions'",
    );
    assert!(diverged(&diverged_error) && !binlog_gone(&diverged_error));
    let ahead = error(
        1236,
        "Error: connecting slave requested to start from GTID 0-1-120, which is not in the master's binlog",
    );
    assert!(diverged(&ahead));
    let purged = error(
        1236,
        "Could not find GTID state requested by slave in any binlog files. Probably the slave state is too old and required binlog files have been purged.",
    );
    assert!(!diverged(&purged) && binlog_gone(&purged));
    assert!(!binlog_gone(&error(2003, "Can't connect")));
    // Another fatal error is reported, never answered with a new clone.
    assert!(!binlog_gone(&error(
        1236,
        "log event entry exceeded max_allowed_packet"
    )));
}

#[test]
fn the_gtid_of_a_copy_is_the_third_field_of_its_binlog_info() {
    assert_eq!(
        clone::binlog_info_gtid("mysql-bin.000001\t810\t0-1-3\n"),
        "0-1-3"
    );
    assert_eq!(clone::binlog_info_gtid("mysql-bin.000001\t810\n"), "");
}

#[test]
fn server_ids_follow_the_ordinal() {
    assert_eq!(server_id("db-0"), 1);
    assert_eq!(server_id("my-db-12"), 13);
    assert!(server_id("standalone") > 1_000_000);
}

#[test]
fn a_binary_log_summary_reads_its_gtid_list_last_gtid_and_transaction_times() {
    // MariaDB 10.11's file: `Gtid list [0-1-7]`, then 0-1-8 at 06:16:28 and 0-1-9, 0-1-10
    // at 06:16:30 (2026-12-07, UTC).
    let bytes = include_bytes!("testdata/mysql-bin.000003");
    let summary = binlog::summarize(std::io::Cursor::new(&bytes[..])).unwrap();
    assert_eq!(summary.gtid_list, "0-1-7");
    assert_eq!(summary.last_gtid, "0-1-10");
    assert_eq!(summary.last_transaction - summary.first_transaction, 2);
    assert!(summary.closed, "a rotated file ends with its Rotate event");
    assert!(binlog::summarize(std::io::Cursor::new(&b"nope"[..])).is_err());
    // A file cut short (still being written, or copied mid-write) is not closed.
    let cut = binlog::summarize(std::io::Cursor::new(&bytes[..400])).unwrap();
    assert!(!cut.closed);
    assert!(cut.length <= 400 && cut.length > 4, "{cut:?}");
    assert_eq!(summary.length, bytes.len() as u64);
}

#[test]
fn the_binary_log_index_names_files_in_order() {
    assert_eq!(
        binlog::indexed_files("./mysql-bin.000001\n./mysql-bin.000002\n../evil\n"),
        vec![
            "mysql-bin.000001".to_string(),
            "mysql-bin.000002".to_string()
        ]
    );
}

#[test]
fn errant_transactions_by_binlog_state_name_what_the_primary_never_logged_from_this_server() {
    // Two promotions since: sequence numbers alone would miss it (0-1-105 < 0-3-160).
    assert_eq!(
        errant_by_state("0-1-105,0-2-50", 1, "0-1-100,0-2-150,0-3-160").unwrap(),
        Some(Some("0-1-101..0-1-105".to_string()))
    );
    assert_eq!(
        errant_by_state("0-1-100", 1, "0-1-100,0-2-150").unwrap(),
        Some(None)
    );
    // The primary's binary log does not reach back to this server: unknown.
    assert_eq!(errant_by_state("0-1-100", 1, "0-3-160").unwrap(), None);
    // Nothing of its own: nothing errant.
    assert_eq!(errant_by_state("0-2-50", 1, "0-3-160").unwrap(), Some(None));
}
