//! CPU time of processes, read from Linux's `/proc`: the servers the bench
//! starts, and a local PostgreSQL's postmaster with its backends.

/// What `/proc/PID/stat` says of one process.
struct Stat {
    parent: u32,
    /// User + system time of the process itself, in ticks.
    own: u64,
    /// The same of its children it has waited for (exited backends).
    reaped: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
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
