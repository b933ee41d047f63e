//! CPU time per operation, the client's and the server's, read from
//! `/proc` at the edges of a run's measured window: where the time of a
//! scenario goes when the machine is saturated (on 2 cores, from
//! concurrency 4 on), throughput being then the inverse of CPU per
//! operation.
//!
//! The client is this process (`/proc/self/stat`). The server is the
//! postmaster of the backend the pool connects to, and every process it
//! started (backends, WAL writer, checkpointer, ...), read when the server
//! runs on this machine and `/proc` shows its processes; otherwise the
//! server's share is unknown and the report says so. Times are in clock
//! ticks, which Linux reports at 100 per second (`USER_HZ`) everywhere it
//! runs: 10 ms of resolution, a fraction of a percent over a window of
//! seconds at full load.

use std::fs;
use std::path::Path;

use idem::sqlx::{self, PgPool};

/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// Where to read CPU time from.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock {
    /// The server's postmaster, when it runs here.
    postmaster: Option<u32>,
}

/// CPU time used so far, in clock ticks.
#[derive(Debug, Clone, Copy)]
pub struct CpuSample {
    client: u64,
    server: Option<u64>,
}

/// CPU time per operation, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuUse {
    pub client_us: f64,
    /// `None`: the server is not on this machine (or `/proc` hides it).
    pub server_us: Option<f64>,
}

impl CpuUse {
    /// The same CPU time spread over `n` messages (or keys) an operation
    /// handled.
    pub fn per(self, n: u64) -> CpuUse {
        let n = n.max(1) as f64;
        CpuUse {
            client_us: self.client_us / n,
            server_us: self.server_us.map(|us| us / n),
        }
    }

    /// The client's and the server's µs, as a report's table shows them
    /// (– when unknown).
    pub fn cells(cpu: Option<CpuUse>) -> (String, String) {
        let us = |us: Option<f64>| us.map_or("–".to_owned(), |us| format!("{us:.0}"));
        (
            us(cpu.map(|cpu| cpu.client_us)),
            us(cpu.and_then(|cpu| cpu.server_us)),
        )
    }
}

impl CpuClock {
    /// Finds the server behind `pool`: the parent of one of its backends.
    pub async fn find(pool: &PgPool) -> CpuClock {
        let backend: Option<i32> = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(pool)
            .await
            .ok();
        let postmaster = backend
            .and_then(|pid| u32::try_from(pid).ok())
            .and_then(|pid| stat(pid).map(|stat| stat.parent));
        CpuClock { postmaster }
    }

    /// The CPU time used so far by this process and by the server.
    pub fn sample(&self) -> CpuSample {
        CpuSample {
            client: fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|text| Stat::parse(&text))
                .map_or(0, |stat| stat.ticks),
            server: self.postmaster.map(server_ticks),
        }
    }
}

impl CpuSample {
    /// The CPU time used between `self` and `later`, per operation.
    pub fn per_op(&self, later: &CpuSample, ops: u64) -> Option<CpuUse> {
        if ops == 0 {
            return None;
        }
        let per_op = |ticks: u64| ticks as f64 / TICKS_PER_SECOND * 1e6 / ops as f64;
        Some(CpuUse {
            client_us: per_op(later.client.saturating_sub(self.client)),
            server_us: self
                .server
                .zip(later.server)
                .map(|(before, after)| per_op(after.saturating_sub(before))),
        })
    }
}

/// The ticks of the postmaster and of every process whose parent it is.
fn server_ticks(postmaster: u32) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|stat| stat.pid == postmaster || stat.parent == postmaster)
        .map(|stat| stat.ticks)
        .sum()
}

/// What the load generator reads of `/proc/<pid>/stat`.
struct Stat {
    pid: u32,
    parent: u32,
    /// User and system time, in clock ticks.
    ticks: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    Stat::parse(&text)
}

impl Stat {
    /// `pid (comm) state ppid ...`: the command may hold spaces and
    /// parentheses, so the fields are counted after its last `)`. utime and
    /// stime are the 14th and 15th fields.
    fn parse(text: &str) -> Option<Stat> {
        let (head, tail) = text.rsplit_once(')')?;
        let pid = head.split_whitespace().next()?.parse().ok()?;
        let fields: Vec<&str> = tail.split_whitespace().collect();
        // `tail` starts at the 3rd field (state).
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            pid,
            parent: u32::try_from(field(4)?).ok()?,
            ticks: field(14)? + field(15)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_past_a_command_with_spaces_and_parentheses() {
        let line = "4242 (postgres: idem (x) ) S 17 4242 4242 0 -1 4194560 1 0 0 0 \
                    250 31 0 0 20 0 1 0 100 0 0";
        let stat = Stat::parse(line).expect("parsed");
        assert_eq!((stat.pid, stat.parent, stat.ticks), (4242, 17, 281));
    }

    #[test]
    fn cpu_per_operation_is_the_difference_over_the_operations() {
        let before = CpuSample {
            client: 100,
            server: Some(1_000),
        };
        let after = CpuSample {
            client: 150,
            server: Some(1_200),
        };
        let per_op = before.per_op(&after, 10_000).expect("some operations");
        assert!((per_op.client_us - 50.0).abs() < 1e-9);
        assert_eq!(per_op.server_us.map(f64::round), Some(200.0));
        assert!(before.per_op(&after, 0).is_none());
    }
}
