//! An agent's process tree read from `/proc` (its group and every descendant, in other
//! sessions too), and signalling it: what freezing and killing a pod act on.

use std::collections::{HashMap, HashSet};

/// What `/proc/<pid>/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: u32,
    state: char,
    ppid: u32,
    pgrp: u32,
}

/// Reads `pid (comm) state ppid pgrp …`; `comm` may hold spaces and parentheses.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let (head, rest) = text.rsplit_once(')')?;
    let pid = head.split_once('(')?.0.trim().parse().ok()?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        state,
        ppid,
        pgrp,
    })
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Stopped by a signal (or traced).
pub(super) fn is_stopped(pid: u32) -> bool {
    proc_stat(pid).is_some_and(|s| matches!(s.state, 'T' | 't'))
}

pub(super) fn is_stopped_or_gone(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|s| matches!(s.state, 'T' | 't' | 'Z' | 'X'))
}

/// `pid`, the members of the process group it leads and all their descendants (whatever
/// their group or session), parents first, zombies left out.
pub(super) fn process_tree(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let table: Vec<ProcStat> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_stat)
        .collect();
    tree_of(pid, &table)
}

fn tree_of(pid: u32, table: &[ProcStat]) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for p in table {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let dead: HashSet<u32> = table
        .iter()
        .filter(|p| matches!(p.state, 'Z' | 'X'))
        .map(|p| p.pid)
        .collect();
    // The group's members whose parent is gone were reparented: reached from the group.
    let roots = table
        .iter()
        .filter(|p| p.pid == pid)
        .chain(table.iter().filter(|p| p.pgrp == pid && p.pid != pid))
        .map(|p| p.pid);
    let mut seen = HashSet::new();
    let mut tree = Vec::new();
    for root in roots {
        let mut queue = std::collections::VecDeque::from([root]);
        while let Some(p) = queue.pop_front() {
            if !seen.insert(p) {
                continue;
            }
            if !dead.contains(&p) {
                tree.push(p);
            }
            queue.extend(children.get(&p).into_iter().flatten());
        }
    }
    tree
}

/// The direct children of `pid` whose command name (`comm`) is one of `names`.
pub(super) fn children_named(pid: u32, names: &[&str]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| proc_stat(*p).is_some_and(|s| s.ppid == pid && !matches!(s.state, 'Z' | 'X')))
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|comm| names.contains(&comm.trim()))
        })
        .collect()
}

pub(super) fn signal_all(pids: &[u32], signal: libc::c_int) {
    for pid in pids {
        // SAFETY: kill(2) has no memory effects; callers pass processes they own (an
        // unreaped agent's tree, see `PodRunner::kill_and_hold`).
        unsafe {
            libc::kill(*pid as libc::pid_t, signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_proc_stat_with_odd_command_names() {
        let stat = "4242 (postgres: a) b) T 4200 4200 4200 0 -1 4194560 1 0";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                pid: 4242,
                state: 'T',
                ppid: 4200,
                pgrp: 4200,
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_process_tree_takes_the_group_and_descendants_in_other_sessions() {
        let p = |pid, state, ppid, pgrp| ProcStat {
            pid,
            state,
            ppid,
            pgrp,
        };
        let table = [
            p(1, 'S', 0, 1),
            // The agent, its engine (same group), a backend in a session of its own and
            // the backend's child.
            p(10, 'S', 1, 10),
            p(11, 'S', 10, 10),
            p(12, 'S', 11, 12),
            p(13, 'S', 12, 12),
            // A group member whose parent is gone (reparented to 1).
            p(14, 'S', 1, 10),
            // A zombie, and strangers.
            p(15, 'Z', 10, 10),
            p(20, 'S', 1, 20),
            p(21, 'S', 20, 20),
        ];
        assert_eq!(tree_of(10, &table), vec![10, 11, 12, 13, 14]);
        assert_eq!(tree_of(99, &table), Vec::<u32>::new());
    }
}
