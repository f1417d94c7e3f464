//! Wrong credentials, counted per client address, at every door: gRPC
//! calls, `/metrics`, the MCP endpoint and the web sign-in share one
//! count per server (see `super::authenticate_from`). A wrong token names
//! no principal, so the address is the only thing to count them by (an
//! IPv6 client by its /64, which one machine usually holds whole). After
//! [`FAILURES`] wrong tokens or certificates from an address within
//! [`WINDOW_MS`] (counted from the first), its calls are refused until
//! that window is over, the right token included: otherwise a guess that
//! hit would still be told so. Other addresses are not affected. A call
//! that succeeds does not reset the count (a caller holding one
//! principal's token could otherwise guess another's between its own
//! calls).
//!
//! The first failure of a window is logged, with the previous window's
//! counts; the rest are counted, not logged, so a flood writes one line a
//! minute. The other refusals of callers that name no principal (no
//! credentials, a malformed header, a forged forwarded call) are logged
//! the same way, counted apart: they are not guesses, and lock nobody out. At most [`MAX_ADDRESSES`] addresses are remembered: when full,
//! the windows that are over go, then the oldest.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;

use crate::clock::Clock;

/// Wrong credentials an address may send in a window.
pub const FAILURES: u32 = 5;
/// A window's length, from an address's first wrong credential.
pub const WINDOW_MS: i64 = 60_000;
/// Addresses remembered at once (about 60 bytes each).
pub const MAX_ADDRESSES: usize = 10_000;

/// Counts wrong credentials per client address.
pub struct Throttle {
    clock: Clock,
    windows: Mutex<HashMap<IpAddr, Window>>,
    /// Other refusals of callers that named no principal (no credentials,
    /// a malformed header, a forged forwarded call): counted apart, for
    /// the log only, so that they lock nobody out.
    unnamed: Mutex<HashMap<IpAddr, Window>>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: i64,
    failures: u32,
    /// Calls refused (throttled) in this window.
    refused: u32,
}

impl Window {
    fn over(&self, now_ms: i64) -> bool {
        now_ms >= self.start_ms + WINDOW_MS
    }
}

/// Whether an address may present credentials.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Open,
    /// Refused for this many more seconds.
    Closed {
        retry_after_s: u64,
    },
}

/// What to log about a wrong credential: `None` while its window's first
/// failure has been logged already.
#[derive(Debug, PartialEq, Eq)]
pub struct FirstFailure {
    /// The previous window's wrong credentials and refused calls, when it had more
    /// than its first (logged) one.
    pub before: Option<(u32, u32)>,
}

/// The key an address is counted under: IPv4 as is (also when mapped into
/// IPv6), IPv6 by its /64.
fn client(peer: Option<SocketAddr>) -> IpAddr {
    match peer.map(|p| p.ip()) {
        None => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        Some(v4) => v4,
    }
}

impl Throttle {
    pub fn new(clock: Clock) -> Throttle {
        Throttle {
            clock,
            windows: Mutex::new(HashMap::new()),
            unnamed: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `peer` may present credentials now; a refusal is counted.
    pub fn check(&self, peer: Option<SocketAddr>) -> Verdict {
        let now = self.clock.now_ms();
        let mut windows = self.windows.lock().expect("throttle");
        let Some(window) = windows.get_mut(&client(peer)) else {
            return Verdict::Open;
        };
        if window.over(now) || window.failures < FAILURES {
            return Verdict::Open;
        }
        window.refused = window.refused.saturating_add(1);
        let left_ms = window.start_ms + WINDOW_MS - now;
        Verdict::Closed {
            retry_after_s: (left_ms as u64).div_ceil(1000).max(1),
        }
    }

    /// Counts a wrong credential from `peer`; `Some` when it is the first of
    /// its window (the one to log).
    pub fn failed(&self, peer: Option<SocketAddr>) -> Option<FirstFailure> {
        count(&self.windows, self.clock.now_ms(), peer)
    }

    /// Counts another refusal of a caller at `peer` that named no
    /// principal, for the log only (it never closes the address); `Some`
    /// when it is the first of its window (the one to log).
    pub fn unnamed(&self, peer: Option<SocketAddr>) -> Option<FirstFailure> {
        count(&self.unnamed, self.clock.now_ms(), peer)
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.windows.lock().unwrap().len()
    }
}

/// Counts one more failure of `peer` in `windows` at `now`; `Some` when
/// it is the first of its window.
fn count(
    windows: &Mutex<HashMap<IpAddr, Window>>,
    now: i64,
    peer: Option<SocketAddr>,
) -> Option<FirstFailure> {
    let key = client(peer);
    let mut windows = windows.lock().expect("throttle");
    if let Some(window) = windows.get_mut(&key) {
        if !window.over(now) {
            window.failures = window.failures.saturating_add(1);
            return None;
        }
        let before = (window.failures > 1 || window.refused > 0)
            .then_some((window.failures, window.refused));
        *window = Window::first(now);
        return Some(FirstFailure { before });
    }
    if windows.len() >= MAX_ADDRESSES {
        windows.retain(|_, w| !w.over(now));
    }
    if windows.len() >= MAX_ADDRESSES {
        let oldest = windows
            .iter()
            .min_by_key(|(_, w)| w.start_ms)
            .map(|(k, _)| *k);
        if let Some(oldest) = oldest {
            windows.remove(&oldest);
        }
    }
    windows.insert(key, Window::first(now));
    Some(FirstFailure { before: None })
}

impl Window {
    fn first(now_ms: i64) -> Window {
        Window {
            start_ms: now_ms,
            failures: 1,
            refused: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ip: &str) -> Option<SocketAddr> {
        Some(SocketAddr::new(ip.parse().unwrap(), 40000))
    }

    #[test]
    fn an_address_is_refused_after_five_failures_until_its_minute_is_over() {
        let clock = Clock::manual();
        let throttle = Throttle::new(clock.clone());
        let mallory = at("192.0.2.1");
        assert_eq!(
            throttle.failed(mallory),
            Some(FirstFailure { before: None })
        );
        for _ in 1..FAILURES {
            assert_eq!(throttle.check(mallory), Verdict::Open);
            assert_eq!(throttle.failed(mallory), None, "logged once a window");
        }
        assert_eq!(
            throttle.check(mallory),
            Verdict::Closed { retry_after_s: 60 }
        );
        // Another address, and another port of this one's, are counted apart.
        assert_eq!(throttle.check(at("192.0.2.2")), Verdict::Open);
        assert!(matches!(
            throttle.check(Some(SocketAddr::new("192.0.2.1".parse().unwrap(), 1))),
            Verdict::Closed { .. }
        ));
        clock.advance(Duration::from_millis(59_001));
        assert_eq!(
            throttle.check(mallory),
            Verdict::Closed { retry_after_s: 1 }
        );
        clock.advance(Duration::from_millis(999));
        assert_eq!(throttle.check(mallory), Verdict::Open);
        // The next window's first failure says what the last one saw.
        assert_eq!(
            throttle.failed(mallory),
            Some(FirstFailure {
                before: Some((FAILURES, 3))
            })
        );
    }

    #[test]
    fn refusals_naming_no_principal_are_logged_once_a_window_and_close_nothing() {
        let clock = Clock::manual();
        let throttle = Throttle::new(clock.clone());
        let anonymous = at("192.0.2.3");
        assert_eq!(
            throttle.unnamed(anonymous),
            Some(FirstFailure { before: None })
        );
        for _ in 0..20 {
            assert_eq!(throttle.unnamed(anonymous), None, "logged once a window");
        }
        assert_eq!(throttle.check(anonymous), Verdict::Open);
        // A wrong token from there is still the first of its own window.
        assert_eq!(
            throttle.failed(anonymous),
            Some(FirstFailure { before: None })
        );
        clock.advance(Duration::from_millis(WINDOW_MS as u64));
        assert_eq!(
            throttle.unnamed(anonymous),
            Some(FirstFailure {
                before: Some((21, 0))
            })
        );
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_and_mapped_ipv4_as_ipv4() {
        let throttle = Throttle::new(Clock::manual());
        for i in 0..FAILURES {
            throttle.failed(at(&format!("2001:db8:1:2::{i}")));
        }
        assert!(matches!(
            throttle.check(at("2001:db8:1:2:ffff::9")),
            Verdict::Closed { .. }
        ));
        assert_eq!(throttle.check(at("2001:db8:1:3::1")), Verdict::Open);
        for _ in 0..FAILURES {
            throttle.failed(at("::ffff:192.0.2.7"));
        }
        assert!(matches!(
            throttle.check(at("192.0.2.7")),
            Verdict::Closed { .. }
        ));
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_window_goes_first() {
        let clock = Clock::manual();
        let throttle = Throttle::new(clock.clone());
        let first = at("10.0.0.0");
        for _ in 0..FAILURES {
            throttle.failed(first);
        }
        clock.advance(Duration::from_millis(1));
        for i in 1..MAX_ADDRESSES as u32 {
            throttle.failed(Some(SocketAddr::new(
                IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)),
                1,
            )));
        }
        assert_eq!(throttle.remembered(), MAX_ADDRESSES);
        assert!(matches!(throttle.check(first), Verdict::Closed { .. }));
        throttle.failed(at("192.0.2.9"));
        assert_eq!(throttle.remembered(), MAX_ADDRESSES);
        assert_eq!(throttle.check(first), Verdict::Open, "the oldest went");
        // Windows that are over go before any live one.
        clock.advance(Duration::from_millis(WINDOW_MS as u64));
        throttle.failed(at("192.0.2.10"));
        assert_eq!(throttle.remembered(), 1);
    }
}
