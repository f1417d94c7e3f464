//! Durations given as a float number of seconds, in API fields and flags:
//! one range per field, checked once at the edge, and conversions that
//! saturate, so that no value (one stored by an older version included) can
//! panic in `Duration`/`Instant` arithmetic or wrap a due time into the past.

use std::time::{Duration, Instant};

const MINUTE: f64 = 60.0;
const HOUR: f64 = 60.0 * MINUTE;
const DAY: f64 = 24.0 * HOUR;
/// 10 years of 365.25 days.
const TEN_YEARS: f64 = 3_652.5 * DAY;

/// The values one seconds field accepts: 0 where it means "not set", else
/// `(0, max]`.
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub max: f64,
    /// What 0 means, when 0 is accepted.
    pub zero: Option<&'static str>,
}

/// A run's `budget.deadline_s`.
pub const DEADLINE: Range = Range {
    max: TEN_YEARS,
    zero: Some("no deadline"),
};
/// A tool's or a run's `approval_timeout_s`.
pub const APPROVAL_TIMEOUT: Range = Range {
    max: TEN_YEARS,
    zero: Some("no timeout"),
};
/// A tool's `heartbeat_timeout_s`: the lease between two heartbeats.
pub const HEARTBEAT_TIMEOUT: Range = Range {
    max: 6.0 * HOUR,
    zero: Some("the server's default"),
};
/// A tool's retry backoffs (`initial_backoff_s`, `max_backoff_s`).
pub const BACKOFF: Range = Range {
    max: DAY,
    zero: Some("the default"),
};
/// The heartbeat interval of an approval watch.
pub const WATCH_HEARTBEAT: Range = Range {
    max: 10.0 * MINUTE,
    zero: Some("the default"),
};
/// PollTask's `wait_s`; the server's cap shortens any longer wait.
pub const POLL_WAIT: Range = Range {
    max: HOUR,
    zero: Some("the server's cap"),
};
/// Flags: `--poll-wait-cap-s` and `--shutdown-grace-s`.
pub const SERVER_WAIT: Range = Range {
    max: HOUR,
    zero: None,
};
/// Flag `--heartbeat-timeout-s`.
pub const SERVER_HEARTBEAT: Range = Range {
    max: HEARTBEAT_TIMEOUT.max,
    zero: None,
};

/// Flag `--lease-s`.
pub const SERVER_LEASE: Range = Range {
    max: 600.0,
    zero: None,
};

impl Range {
    /// `value` if it lies in the range; else a sentence naming the range.
    pub fn check(&self, value: f64) -> Result<f64, String> {
        let in_range = value.is_finite()
            && value <= self.max
            && (value > 0.0 || (value == 0.0 && self.zero.is_some()));
        if in_range {
            return Ok(value);
        }
        // 1e20 reads better than its 21 digits.
        let shown = if value.abs() >= 1e9 {
            format!("{value:e}")
        } else {
            value.to_string()
        };
        Err(format!("{shown} is out of range: {}", self.describe()))
    }

    /// The accepted values, in words: "seconds in (0, 3600], or 0 for ...".
    pub fn describe(&self) -> String {
        let range = format!("a number of seconds > 0 and <= {}", self.max);
        match self.zero {
            Some(meaning) => format!("{range}, or 0 for {meaning}"),
            None => range,
        }
    }
}

/// Longest duration the conversions give: far beyond any accepted value,
/// and small enough to add to any `Instant` or epoch milliseconds.
const CEILING: f64 = 100.0 * 365.25 * DAY;

/// `seconds` as a Duration: negative or NaN is zero, more than a century
/// is a century.
pub fn duration(seconds: f64) -> Duration {
    if seconds.is_nan() || seconds <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(seconds.min(CEILING))
}

/// `seconds` in whole milliseconds, saturating as [`duration`] does.
pub fn millis(seconds: f64) -> i64 {
    duration(seconds).as_millis() as i64
}

/// The epoch time `seconds` after `now_ms`.
pub fn after_ms(now_ms: i64, seconds: f64) -> i64 {
    now_ms.saturating_add(millis(seconds))
}

/// The instant `timeout` after `now`, or as late as the clock can say.
pub fn instant_after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .or_else(|| now.checked_add(duration(CEILING)))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_name_their_bounds_and_what_zero_means() {
        assert_eq!(DEADLINE.check(0.0), Ok(0.0));
        assert_eq!(DEADLINE.check(3600.0), Ok(3600.0));
        for bad in [-1.0, 1e16, f64::NAN, f64::INFINITY, 1e308] {
            let error = DEADLINE.check(bad).unwrap_err();
            assert!(error.contains("<= 315576000"), "{error}");
            assert!(error.contains("0 for no deadline"), "{error}");
        }
        assert!(SERVER_WAIT.check(0.0).is_err());
        assert!(HEARTBEAT_TIMEOUT.check(1e19).is_err());
    }

    #[test]
    fn conversions_saturate_instead_of_panicking_or_wrapping() {
        for huge in [1e19, 1e308, f64::INFINITY, f64::MAX] {
            assert_eq!(duration(huge), duration(CEILING));
            assert!(after_ms(1_700_000_000_000, huge) > 1_700_000_000_000);
            let now = Instant::now();
            assert!(instant_after(now, duration(huge)) > now);
            assert!(instant_after(now, Duration::MAX) >= now);
        }
        assert_eq!(duration(f64::NAN), Duration::ZERO);
        assert_eq!(millis(-5.0), 0);
        assert_eq!(after_ms(i64::MAX - 1, 10.0), i64::MAX);
        assert_eq!(millis(1.5), 1500);
    }
}
