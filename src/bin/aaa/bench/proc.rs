//! CPU time read from Linux's `/proc`: of the servers the bench starts (one
//! thread of them too), of a local PostgreSQL's postmaster with its
//! backends, and of the whole machine.

use serde::Serialize;

/// CPU time per call over a stretch of calls, in µs.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct CpuPerCall {
    /// The whole machine's busy time: the bench's client, the server, and
    /// anything else running.
    pub machine_us: Option<f64>,
    /// The server's (one the bench started).
    pub server_us: Option<f64>,
    /// Of that, the embedded store's committer thread: the log's writes
    /// and fsyncs, and applying each round to the index.
    pub committer_us: Option<f64>,
}

/// Readings at the start of a stretch of calls; [`CpuMeter::per_call`]
/// divides what was used since by the calls made.
pub struct CpuMeter {
    server: Option<u32>,
    machine: Option<f64>,
    own: Option<f64>,
    committer: Option<f64>,
}

/// The embedded store's committer thread, as the server names it.
const COMMITTER: &str = "aaa-committer";

impl CpuMeter {
    /// Starts measuring the machine, and the server process `server` if
    /// the bench started it.
    pub fn start(server: Option<u32>) -> CpuMeter {
        CpuMeter {
            server,
            machine: machine_busy_seconds(),
            own: server.and_then(cpu_seconds),
            committer: server.and_then(|pid| thread_cpu_seconds(pid, COMMITTER)),
        }
    }

    pub fn per_call(&self, calls: usize) -> CpuPerCall {
        let per_call = |before: Option<f64>, now: Option<f64>| {
            Some(1e6 * (now? - before?) / calls.max(1) as f64)
        };
        CpuPerCall {
            machine_us: per_call(self.machine, machine_busy_seconds()),
            server_us: per_call(self.own, self.server.and_then(cpu_seconds)),
            committer_us: per_call(
                self.committer,
                self.server
                    .and_then(|pid| thread_cpu_seconds(pid, COMMITTER)),
            ),
        }
    }
}

/// What `/proc/PID/stat` says of one process.
struct Stat {
    parent: u32,
    /// User + system time of the process itself, in ticks.
    own: u64,
    /// The same of its children it has waited for (exited backends).
    reaped: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A `/proc/PID/stat` (or `/proc/PID/task/TID/stat`) line.
fn parse_stat(stat: &str) -> Option<Stat> {
    // Fields after the command's closing parenthesis (which may hold
    // spaces): state is the 3rd field, the parent the 4th, utime and stime
    // the 14th and 15th, cutime and cstime the 16th and 17th.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Stat {
        parent: number(1)? as u32,
        own: number(11)? + number(12)?,
        reaped: number(13)? + number(14)?,
    })
}

/// /proc counts in USER_HZ, 100 per second on Linux whatever the kernel's
/// own tick.
fn seconds(ticks: u64) -> f64 {
    ticks as f64 / 100.0
}

/// CPU time `pid` used so far (user + system), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat(pid).map(|s| seconds(s.own))
}

/// CPU time used so far by the threads of `pid` named `name` (their
/// `comm`, as the server names them), in seconds.
pub fn thread_cpu_seconds(pid: u32, name: &str) -> Option<f64> {
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("stat")) else {
            continue; // a thread that just exited
        };
        let comm = stat
            .split_once('(')
            .and_then(|(_, rest)| rest.rsplit_once(')'));
        if comm.is_some_and(|(comm, _)| comm == name) {
            ticks += parse_stat(&stat)?.own;
        }
    }
    Some(seconds(ticks))
}

/// CPU time the whole machine spent busy so far, summed over its CPUs
/// (everything but idle and waiting for I/O), in seconds: the bench's own
/// client, the servers and anything else running.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is
    // counted in user already).
    let busy: u64 = ticks.iter().take(8).sum::<u64>() - ticks.get(3)? - ticks.get(4)?;
    Some(seconds(busy))
}

/// CPU time used so far by `pid`, its live children and the children it
/// reaped, in seconds: a PostgreSQL postmaster and every backend it forked.
pub fn family_cpu_seconds(pid: u32) -> Option<f64> {
    let root = stat(pid)?;
    let children: u64 = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|child| child.parent == pid)
        .map(|child| child.own + child.reaped)
        .sum();
    Some(seconds(root.own + root.reaped + children))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_counted_by_its_name_and_the_machine_by_its_busy_time() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let machine_before = machine_busy_seconds().expect("/proc/stat reads");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let spin = std::thread::Builder::new()
            .name("bench-spin".into())
            .spawn(move || {
                while !spinning.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .expect("spawns");
        // Read while it is alive (an exited thread has no stat), until it
        // has burnt a tenth of a second.
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut spun = 0.0;
        while spun < 0.1 && std::time::Instant::now() < give_up {
            spun = thread_cpu_seconds(std::process::id(), "bench-spin").expect("task stats");
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        spin.join().expect("spins");
        assert!(spun >= 0.1, "the named thread's CPU counts: {spun} s");
        let none = thread_cpu_seconds(std::process::id(), "no-such-thread").expect("task stats");
        assert_eq!(none, 0.0);
        let machine = machine_busy_seconds().expect("/proc/stat reads") - machine_before;
        assert!(
            machine >= 0.1,
            "the machine was busy at least as long: {machine} s"
        );
    }

    #[test]
    fn a_family_counts_the_children_it_reaped() {
        let me = std::process::id();
        // A child that burns about 0.2 s of CPU, then is reaped: its time
        // moves into this process's reaped share, which `cpu_seconds`
        // leaves out and `family_cpu_seconds` counts.
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let family = family_cpu_seconds(me).expect("this process has a stat");
        let own = cpu_seconds(me).expect("this process has a stat");
        assert!(
            family - own >= 0.05,
            "the reaped child's CPU counts: family {family} s, own {own} s"
        );
    }
}
