//! The report: every figure as a table row, the targets beside the
//! figures they judge (PASS / FAIL), and the JSON written with `--out`.

use serde::Serialize;

use super::stats::{ms, Problems};
use super::Results;

/// One line of the table. `pass` is None for figures without a target, or
/// when the target's reference was not measured.
#[derive(Debug, Serialize)]
pub struct Row {
    pub scenario: String,
    pub metric: String,
    pub value: String,
    pub target: String,
    pub pass: Option<bool>,
}

#[derive(Default)]
pub struct Table {
    pub rows: Vec<Row>,
}

impl Table {
    fn add(&mut self, scenario: &str, metric: &str, value: String) {
        self.judge(scenario, metric, value, "", None);
    }

    fn judge(
        &mut self,
        scenario: &str,
        metric: &str,
        value: String,
        target: &str,
        pass: Option<bool>,
    ) {
        self.rows.push(Row {
            scenario: scenario.into(),
            metric: metric.into(),
            value,
            target: target.into(),
            pass,
        });
    }

    pub fn failed_targets(&self) -> usize {
        self.rows.iter().filter(|r| r.pass == Some(false)).count()
    }

    pub fn print(&self) {
        let header = ["scenario", "metric", "value", "target", "ok"];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                let ok = match r.pass {
                    Some(true) => "PASS",
                    Some(false) => "FAIL",
                    None if r.target.is_empty() => "",
                    None => "n/a",
                };
                [
                    r.scenario.clone(),
                    r.metric.clone(),
                    r.value.clone(),
                    r.target.clone(),
                    ok.to_string(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &cells {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |row: [&str; 5]| {
            let padded: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            println!("{}", padded.join("  ").trim_end());
        };
        line(header);
        for row in &cells {
            line(row.each_ref().map(String::as_str));
        }
    }
}

/// 12345.6 -> "12,346".
pub fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn problems_text(problems: &Problems) -> String {
    match problems.first.first() {
        None => "0".into(),
        Some(first) => {
            let first: String = first.chars().take(80).collect();
            format!("{} (first: {first})", problems.count)
        }
    }
}

/// Builds the table from whatever scenarios ran.
pub fn table(results: &Results) -> Table {
    let mut t = Table::default();
    let rtt_p50 = results.rtt.as_ref().map(|r| r.latency.p50_ms);
    let ceiling = results.store_ceiling.as_ref().map(|s| s.per_second);
    let on_postgres = results.store == "postgres";

    if let Some(rtt) = &results.rtt {
        t.add(
            "floor",
            "no-op round trip (Health/Check) p50 / p99",
            rtt.latency.text(),
        );
    }
    if let Some(noop) = &results.noop {
        t.add(
            "floor",
            &format!("no-op calls/s (Health/Check), {} in flight", noop.clients),
            thousands(noop.per_second),
        );
    }
    if let Some(store) = &results.store_ceiling {
        // The target is the embedded store's; PostgreSQL is judged by the
        // cycles it carries against its own floor below.
        let (target, pass) = match on_postgres {
            false => (">= 50,000/s", Some(store.per_second >= 50_000.0)),
            true => ("", None),
        };
        t.judge(
            "floor",
            &format!(
                "store ceiling ({}), {} writers: acked appends/s",
                results.store, store.writers
            ),
            thousands(store.per_second),
            target,
            pass,
        );
        t.add("floor", "store commit p50 / p99", store.latency.text());
    }
    if let Some(one) = &results.store_one_writer {
        t.add(
            "floor",
            "store commit, one writer: p50 / p99",
            one.latency.text(),
        );
    }
    if let Some(floor) = &results.postgres_floor {
        t.add(
            "floor",
            "postgres one-row commit p50 / p99",
            floor.one_row_commit.text(),
        );
        t.add(
            "floor",
            &format!("postgres one-row commits/s, {} connections", floor.writers),
            thousands(floor.rows_per_second),
        );
    }
    // A cycle is three commits in sequence and three round trips (StartRun
    // -> approval seen, Signal -> task, CompleteTask -> completed seen). On
    // PostgreSQL a commit costs at least the database's one-row commit.
    let one_commit = match (&results.postgres_floor, &results.store_one_writer) {
        (Some(floor), _) => Some(floor.one_row_commit.p50_ms),
        (None, Some(one)) => Some(one.latency.p50_ms),
        _ => None,
    };
    let cycle_floor = match (rtt_p50, one_commit) {
        (Some(rtt), Some(commit)) => Some(3.0 * (rtt + commit)),
        _ => None,
    };
    let x64_target = if on_postgres { 1000.0 } else { 2000.0 };

    for level in results.cycle.iter().flat_map(|c| &c.levels) {
        let scenario = format!("cycle x{}", level.in_flight);
        let (target, pass) = match level.in_flight {
            64 => (
                format!(">= {}/s", thousands(x64_target)),
                Some(level.per_second >= x64_target),
            ),
            _ => (String::new(), None),
        };
        t.judge(
            &scenario,
            &format!("cycles/s ({} cycles)", level.cycles),
            thousands(level.per_second),
            &target,
            pass,
        );
        let (target, pass) = match (level.in_flight, rtt_p50) {
            (1, _) if on_postgres => match cycle_floor {
                Some(floor) => (
                    format!("p50 <= 1.5x floor = {} ms", ms(1.5 * floor)),
                    Some(level.latency.p50_ms <= 1.5 * floor),
                ),
                None => ("p50 <= 1.5x floor".into(), None),
            },
            (1, Some(rtt)) => (
                format!("p50 <= 10x round trip = {} ms", ms(10.0 * rtt)),
                Some(level.latency.p50_ms <= 10.0 * rtt),
            ),
            (1, None) => ("p50 <= 10x round trip".into(), None),
            _ => (String::new(), None),
        };
        t.judge(
            &scenario,
            "StartRun -> completed p50 / p99",
            level.latency.text(),
            &target,
            pass,
        );
        if let (1, Some(floor)) = (level.in_flight, cycle_floor) {
            t.add(
                &scenario,
                match on_postgres {
                    true => "floor: 3 x (round trip + postgres one-row commit) p50",
                    false => "floor: 3 x (round trip + one-writer commit) p50",
                },
                format!("{} ms", ms(floor)),
            );
        }
    }

    if let Some(a) = &results.appends {
        let (target, pass) = match ceiling {
            Some(c) => (
                format!(">= 0.5x ceiling = {}/s", thousands(0.5 * c)),
                Some(a.per_second >= 0.5 * c),
            ),
            None => (">= 0.5x store ceiling".into(), None),
        };
        t.judge(
            "appends",
            &format!(
                "Signal appends/s, {} clients ({} events)",
                a.clients,
                thousands(a.events as f64)
            ),
            thousands(a.per_second),
            &target,
            pass,
        );
        if let Some(c) = ceiling {
            t.add(
                "appends",
                "fraction of the store ceiling",
                format!("{:.2}", a.per_second / c),
            );
        }
        if let Some(noop) = &results.noop {
            t.add(
                "appends",
                "fraction of the no-op calls/s",
                format!("{:.2}", a.per_second / noop.per_second),
            );
        }
        t.add("appends", "Signal p50 / p99", a.latency.text());
    }

    if let Some(f) = &results.fanout {
        t.judge(
            "fan-out",
            &format!(
                "deliveries ({} followers x {} events)",
                f.followers, f.events
            ),
            format!(
                "{} of {}, {} missed",
                thousands(f.delivered as f64),
                thousands(f.expected as f64),
                f.missed
            ),
            "nothing missed",
            Some(f.missed == 0 && f.expected > 0),
        );
        t.judge(
            "fan-out",
            "lag (Signal sent -> follower got it) p50 / p99",
            f.lag.text(),
            "p99 < 50 ms",
            Some(f.lag.count > 0 && f.lag.p99_ms < 50.0),
        );
        t.add(
            "fan-out",
            "lag after the Signal's answer p50 / p99",
            f.lag_after_ack.text(),
        );
        t.add(
            "fan-out",
            "appends/s (one client, sequential)",
            thousands(f.appends_per_second),
        );
    }

    if let Some(p) = &results.parked {
        t.add(
            "parked",
            "runs parked at approval (runs/s)",
            format!(
                "{} ({}/s)",
                thousands(p.parked as f64),
                thousands(p.parked_per_second)
            ),
        );
        if let (Some(before), Some(parked), Some(per)) =
            (p.rss_before_kib, p.rss_parked_kib, p.kib_per_parked)
        {
            // Memory does not grow linearly with N: judge it at 100k only.
            // The embedded store's page cache counts in the server's RSS.
            let limit_mib = if on_postgres { 100 } else { 150 };
            let pass = (p.parked >= 100_000).then_some(parked < limit_mib * 1024);
            t.judge(
                "parked",
                &format!("server RSS with {} parked", thousands(p.parked as f64)),
                format!("{} ({} before, {per:.1} KiB/run)", mib(parked), mib(before)),
                &format!("< {limit_mib} MiB at 100k"),
                pass,
            );
        }
        t.judge(
            "parked",
            "ListApprovals first page p50 / p99",
            p.list_first_page.text(),
            "p50 < 20 ms",
            Some(p.list_first_page.count > 0 && p.list_first_page.p50_ms < 20.0),
        );
        t.add(
            "parked",
            "WatchApprovals snapshot complete",
            format!(
                "{} ms ({} pending)",
                ms(p.snapshot_ms),
                thousands(p.snapshot_pending as f64)
            ),
        );
        if let Some(ready) = p.ready_ms {
            t.judge(
                "parked",
                "kill -9, restart -> Health SERVING",
                format!("{} ms", ms(ready)),
                "< 1,000 ms",
                Some(ready < 1000.0),
            );
        }
        if let Some(rss) = p.rss_after_restart_kib {
            t.add("parked", "server RSS after restart", mib(rss));
        }
        if let (Some(first), Some(grant)) = (p.first_approval_ms, p.grant_to_completed_ms) {
            t.add(
                "parked",
                "restart -> first approval completed (grant -> done)",
                format!("{} ms ({} ms)", ms(first), ms(grant)),
            );
        }
    }

    if let Some(cluster) = &results.cluster {
        cluster_rows(&mut t, cluster);
    }

    let problems = results.problems();
    t.judge(
        "all",
        "correctness problems (errors, missed events)",
        problems_text(&problems),
        "0",
        Some(problems.is_empty()),
    );
    t
}

/// The cluster's rows: cycles per size against one server's, forwarding's
/// cost, failover times against the target.
fn cluster_rows(t: &mut Table, cluster: &super::cluster::Cluster) {
    let alone = cluster
        .sizes
        .iter()
        .find(|s| s.servers == 1)
        .map(|s| s.cycle.per_second);
    for size in &cluster.sizes {
        let scenario = format!("cluster x{}", size.servers);
        // The two cores are shared by every server: more servers may not
        // add cycles, but coordination must not collapse them.
        let (target, pass) = match (size.servers, alone) {
            (1, _) | (_, None) => (String::new(), None),
            (_, Some(alone)) => (
                format!(">= 0.8x one server = {}/s", thousands(0.8 * alone)),
                Some(size.cycle.per_second >= 0.8 * alone),
            ),
        };
        t.judge(
            &scenario,
            &format!(
                "cycles/s, 64 in flight, {:.0}% of calls forwarded ({} cycles)",
                100.0 * size.forwarded_share,
                size.cycle.cycles
            ),
            thousands(size.cycle.per_second),
            &target,
            pass,
        );
        t.add(
            &scenario,
            "StartRun -> completed p50 / p99",
            size.cycle.latency.text(),
        );
        let cpu = match size.servers {
            1 => format!("{} ms", ms(size.owner_cpu_ms_per_cycle)),
            _ => format!(
                "{} + {} ms",
                ms(size.owner_cpu_ms_per_cycle),
                ms(size.standbys_cpu_ms_per_cycle)
            ),
        };
        t.add(&scenario, "server CPU per cycle: owner + standbys", cpu);
        t.add(
            &scenario,
            "Signal at the owner p50 / p99",
            size.direct.text(),
        );
        if let Some(forwarded) = &size.forwarded {
            t.add(
                &scenario,
                "Signal through a standby (forwarded) p50 / p99 (extra p50)",
                format!(
                    "{} (+{} ms)",
                    forwarded.text(),
                    ms(forwarded.p50_ms - size.direct.p50_ms)
                ),
            );
        }
    }
    if let Some(f) = &cluster.failover {
        let scenario = format!("failover x{}", f.servers);
        t.add(
            &scenario,
            &format!(
                "kill -9 of the owner -> runs owned again (lease {} s)",
                cluster.lease_s
            ),
            format!("{:.2} s", f.owned_again_s),
        );
        t.judge(
            &scenario,
            "kill -9 -> first parked run granted and completed",
            format!("{:.2} s", f.first_completed_s),
            "< 5 s",
            Some(f.first_completed_s < 5.0),
        );
        t.add(
            &scenario,
            &format!(
                "kill -9 -> all {} parked runs completed (one by one)",
                f.parked
            ),
            format!("{:.2} s", f.all_completed_s),
        );
    }
}
